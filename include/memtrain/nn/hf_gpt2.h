// Hugging Face GPT-2 checkpoints (model.safetensors + config.json) for nn::GPT.
//
// Loading accepts both layouts transformers writes: GPT2LMHeadModel ("transformer.wte.weight", ...,
// "lm_head.weight") and GPT2Model, as in the hub's gpt2/model.safetensors ("wte.weight", ...). Names the
// model has no use for are skipped and returned: "lm_head.weight" (the head is tied to wte, and
// transformers itself re-ties it on load rather than reading it) and the causal-mask buffers
// "h.{i}.attn.bias" / "h.{i}.attn.masked_bias". HF's Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj) are stored [in, out] and nn::Linear's are [out, in]: they are transposed on load and on save.
// Tensors may be F32, F16, BF16 or F64 in the file and are converted to the model's dtype.
//
// config.json: vocab_size, n_positions (-> block_size; n_ctx when n_positions is absent), n_embd, n_layer,
// n_head are read; resid_pdrop becomes the one dropout rate of nn::GPT (embd_pdrop and attn_pdrop are not
// used). Keys that would change the computation are refused rather than silently ignored: an
// activation_function other than gelu_new / gelu_pytorch_tanh (both tanh GELU), a layer_norm_epsilon other
// than 1e-5, n_inner other than null / 4 n_embd, scale_attn_weights false, scale_attn_by_inverse_layer_idx
// true, tie_word_embeddings false, a model_type other than gpt2. Those keys and resid_pdrop take GPT2Config's
// defaults when absent; the sizes must be present.
#pragma once

#include "memtrain/core/dtype.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/gpt_config.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace memtrain::nn {

// The GPTConfig described by an HF config.json; throws memtrain::Error naming the file and the key.
GPTConfig gpt2_config_from_hf_json(const std::string& config_json_path);

// Copies the tensors of an HF GPT-2 model.safetensors into `model`, whose config must match the file's
// shapes. Every problem is checked before anything is copied, and one memtrain::Error names the file and
// each missing, unexpected, mis-shaped or non-floating tensor (by its name in the file). Returns the names
// it skipped (lm_head.weight, attn.bias, attn.masked_bias), as spelled in the file.
std::vector<std::string> load_hf_gpt2(GPT& model, const std::string& safetensors_path);

// A GPT built from `path` and loaded from it, in eval mode (as transformers' from_pretrained returns it).
// `path` is a .safetensors file or a directory holding model.safetensors. config.json beside the file is
// used when present; without it the sizes are inferred from the tensor shapes (vocab_size and n_embd from
// wte, block_size from wpe, n_layer from the h.{i} blocks), except n_head, which the caller must pass.
// A caller's n_head that contradicts config.json is an error. `dropout` overrides the rate (resid_pdrop
// from config.json; GPT2Config's default 0.1 without one).
std::shared_ptr<GPT> gpt2_from_pretrained(const std::string& path, std::optional<std::int64_t> n_head = {},
                                          std::optional<double> dropout = {}, DType dtype = DType::f32);

// Writes `model` in HF's GPT2Model layout: no prefix, Conv1D weights back to [in, out], every tensor F32,
// metadata {"format": "pt"} (transformers requires it), no lm_head or mask buffers (transformers rebuilds
// them); and config.json in the same directory. Both files are written atomically. Refuses a model without
// biases (GPT-2 has them).
void save_hf_gpt2(const GPT& model, const std::string& safetensors_path);

}  // namespace memtrain::nn
