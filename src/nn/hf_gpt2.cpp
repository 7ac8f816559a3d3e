// Hugging Face GPT-2 checkpoints: name mapping (prefix, skipped buffers), the Conv1D transpose, config.json.
// The file is read once into CPU tensors; every check runs before the model's storage is touched, and the
// copy itself is Module::load_state_dict (which converts dtype and crosses devices).
#include "memtrain/nn/hf_gpt2.h"

#include "io/json_file.h"
#include "memtrain/core/error.h"
#include "memtrain/io/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace memtrain::nn {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kConfig = "gpt2_config_from_hf_json";
constexpr const char* kLoad = "load_hf_gpt2";
constexpr const char* kFrom = "gpt2_from_pretrained";
constexpr const char* kSave = "save_hf_gpt2";
constexpr std::string_view kPrefix = "transformer.";  // GPT2LMHeadModel's base-model prefix
constexpr double kLayerNormEps = 1e-5;                // what nn::GPT's LayerNorms use
constexpr double kDefaultDropout = 0.1;               // GPT2Config's resid_pdrop default

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The layer index of a "h.{i}.rest" name and the rest, or nullopt for any other name.
std::optional<std::pair<std::int64_t, std::string_view>> split_block(std::string_view name) {
  if (!starts_with(name, "h.")) return std::nullopt;
  std::size_t i = 2;
  while (i < name.size() && i < 12 && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == 2 || i >= name.size() || name[i] != '.') return std::nullopt;
  return std::make_pair(std::stoll(std::string(name.substr(2, i - 2))), name.substr(i + 1));
}

// HF's Conv1D layers, whose weights are [in, out] in the file and [out, in] in nn::Linear.
bool is_conv1d_weight(std::string_view name) {
  auto b = split_block(name);
  if (!b) return false;
  for (std::string_view w : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (b->second == w) return true;
  return false;
}

// The causal-mask buffers of GPT2Attention: constants that nn::GPT's attention computes itself.
bool is_mask_buffer(std::string_view name) {
  auto b = split_block(name);
  return b && (b->second == "attn.bias" || b->second == "attn.masked_bias");
}

bool loadable_dtype(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::f64; }

// The file's tensors keyed by their nn::GPT name (prefix stripped), each with its spelling in the file.
struct HfTensors {
  std::map<std::string, std::pair<std::string, Tensor>> by_name;
  std::vector<std::string> ignored;
};

HfTensors read_hf_tensors(const std::string& path) {
  HfTensors out;
  for (auto& [file_name, t] : io::load_safetensors(path)) {
    const std::string name = starts_with(file_name, kPrefix) ? file_name.substr(kPrefix.size()) : file_name;
    if (name == "lm_head.weight" || is_mask_buffer(name)) {
      out.ignored.push_back(file_name);
      continue;
    }
    auto [it, inserted] = out.by_name.emplace(name, std::make_pair(file_name, t));
    MT_CHECK(inserted, kLoad, "'{}': tensors '{}' and '{}' are both '{}' once the '{}' prefix is dropped", path,
             it->second.first, file_name, name, kPrefix);
  }
  return out;
}

// Checks every tensor against the model, then copies; returns the skipped names.
std::vector<std::string> load_into(GPT& model, const HfTensors& file, const std::string& path) {
  const StateDict own = model.state_dict();
  StateDict dict;
  std::vector<std::string> missing, unexpected, mismatched, bad_dtype;
  for (const auto& [name, t] : own) {
    auto it = file.by_name.find(name);
    if (it == file.by_name.end()) {
      missing.push_back(name);
      continue;
    }
    const auto& [file_name, ft] = it->second;
    if (!loadable_dtype(ft.dtype())) {
      bad_dtype.push_back(fmt::format("{} ({})", file_name, io::safetensors_dtype_name(ft.dtype())));
      continue;
    }
    const bool conv = is_conv1d_weight(name);
    const Shape want = conv ? Shape{t.size(1), t.size(0)} : t.shape();
    if (ft.shape() != want) {
      mismatched.push_back(fmt::format("{} (file {} vs model {}{})", file_name, shape_str(ft.shape()),
                                       shape_str(want), conv ? ", Conv1D [in, out]" : ""));
      continue;
    }
    dict.emplace(name, conv ? ft.t() : ft);
  }
  for (const auto& [name, entry] : file.by_name)
    if (own.count(name) == 0) unexpected.push_back(entry.first);

  std::string problems;
  auto add = [&](const char* what, const std::vector<std::string>& names) {
    if (!names.empty()) problems += fmt::format("; {}: {}", what, fmt::join(names, ", "));
  };
  add("missing tensors", missing);
  add("unexpected tensors", unexpected);
  add("shape mismatch", mismatched);
  add("not F32/F16/BF16/F64", bad_dtype);
  const GPTConfig& c = model.config();
  MT_CHECK(problems.empty(), kLoad,
           "'{}' does not fit the model (vocab_size {}, block_size {}, n_embd {}, n_layer {}){}", path, c.vocab_size,
           c.block_size, c.n_embd, c.n_layer, problems);
  model.load_state_dict(dict, /*strict=*/true);
  return file.ignored;
}

// ---- config.json ------------------------------------------------------------------------------------------

// Typed access to one config.json; every error names the file and the key.
class HfConfig {
 public:
  HfConfig(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  std::int64_t size(const char* key) const {
    MT_CHECK(has(key), kConfig, "'{}': missing \"{}\"", path_, key);
    const json& v = j_.at(key);
    MT_CHECK(v.is_number_integer() && v.get<std::int64_t>() > 0, kConfig,
             "'{}': \"{}\" must be a positive integer, got {}", path_, key, v.dump());
    return v.get<std::int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    MT_CHECK(j_.at(key).is_number(), kConfig, "'{}': \"{}\" must be a number, got {}", path_, key, j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    MT_CHECK(j_.at(key).is_string(), kConfig, "'{}': \"{}\" must be a string, got {}", path_, key, j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    MT_CHECK(j_.at(key).is_boolean(), kConfig, "'{}': \"{}\" must be true or false, got {}", path_, key,
             j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  const std::string& path() const { return path_; }

 private:
  json j_;
  std::string path_;
};

std::string config_path_beside(const std::string& safetensors_path) {
  return (fs::path(safetensors_path).parent_path() / "config.json").string();
}

// Sizes from the tensors alone, for a file without config.json.
GPTConfig infer_config(const HfTensors& file, const std::string& path, std::optional<std::int64_t> n_head) {
  auto matrix = [&](const std::string& name) {
    auto it = file.by_name.find(name);
    MT_CHECK(it != file.by_name.end(), kFrom, "'{}': no config.json beside it, and no '{}' to infer sizes from",
             path, name);
    const Tensor& t = it->second.second;
    MT_CHECK(t.dim() == 2, kFrom, "'{}': '{}' is {}, expected a matrix", path, it->second.first, shape_str(t.shape()));
    return t.shape();
  };
  const Shape wte = matrix("wte.weight"), wpe = matrix("wpe.weight");  // [V, C], [T, C]
  std::int64_t n_layer = 0;
  for (const auto& [name, entry] : file.by_name)
    if (auto b = split_block(name)) n_layer = std::max(n_layer, b->first + 1);
  MT_CHECK(n_head.has_value(), kFrom,
           "'{}': no config.json beside it, and n_head cannot be inferred from tensor shapes: pass n_head "
           "(12 for gpt2-124M)",
           path);
  GPTConfig c;
  c.vocab_size = wte[0], c.n_embd = wte[1], c.block_size = wpe[0], c.n_layer = n_layer, c.n_head = *n_head;
  c.dropout = kDefaultDropout;
  c.bias = true;
  return c;
}

}  // namespace

GPTConfig gpt2_config_from_hf_json(const std::string& config_json_path) {
  const HfConfig j(detail::read_json_object_file(config_json_path, kConfig), config_json_path);
  const std::string& p = j.path();
  const std::string model_type = j.string("model_type", "gpt2");
  MT_CHECK(model_type == "gpt2", kConfig, "'{}': model_type \"{}\" is not \"gpt2\"", p, model_type);
  const std::string act = j.string("activation_function", "gelu_new");
  MT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", kConfig,
           "'{}': activation_function \"{}\" is not supported (nn::GPT uses the tanh GELU, \"gelu_new\")", p, act);
  const double eps = j.number("layer_norm_epsilon", kLayerNormEps);
  MT_CHECK(std::abs(eps - kLayerNormEps) <= 1e-12, kConfig,
           "'{}': layer_norm_epsilon {} is not supported (nn::GPT's LayerNorm uses 1e-05)", p, eps);
  MT_CHECK(j.boolean("scale_attn_weights", true), kConfig,
           "'{}': scale_attn_weights false is not supported (nn::GPT scales scores by 1/sqrt(head_dim))", p);
  MT_CHECK(!j.boolean("scale_attn_by_inverse_layer_idx", false), kConfig,
           "'{}': scale_attn_by_inverse_layer_idx true is not supported", p);
  MT_CHECK(j.boolean("tie_word_embeddings", true), kConfig,
           "'{}': tie_word_embeddings false is not supported (nn::GPT's head is wte)", p);

  GPTConfig c;
  c.vocab_size = j.size("vocab_size");
  c.block_size = j.has("n_positions") ? j.size("n_positions") : j.size("n_ctx");
  c.n_embd = j.size("n_embd");
  c.n_layer = j.size("n_layer");
  c.n_head = j.size("n_head");
  c.bias = true;
  c.dropout = j.number("resid_pdrop", kDefaultDropout);
  if (j.has("n_inner"))
    MT_CHECK(j.size("n_inner") == 4 * c.n_embd, kConfig,
             "'{}': n_inner {} is not supported (nn::GPT's MLP is 4 n_embd = {})", p, j.size("n_inner"), 4 * c.n_embd);
  try {
    c.validate();
  } catch (const Error& e) {
    detail::throw_error(kConfig, fmt::format("'{}': {}", p, e.what()));
  }
  return c;
}

std::vector<std::string> load_hf_gpt2(GPT& model, const std::string& safetensors_path) {
  return load_into(model, read_hf_tensors(safetensors_path), safetensors_path);
}

std::shared_ptr<GPT> gpt2_from_pretrained(const std::string& path, std::optional<std::int64_t> n_head,
                                          std::optional<double> dropout, DType dtype) {
  const bool is_dir = fs::is_directory(path);
  const std::string file = is_dir ? (fs::path(path) / "model.safetensors").string() : path;
  MT_CHECK(fs::is_regular_file(file), kFrom, "'{}': no such file{}", file,
           is_dir ? " (a checkpoint directory must hold model.safetensors)" : "");
  const HfTensors tensors = read_hf_tensors(file);
  const std::string config_path = config_path_beside(file);
  GPTConfig c;
  if (fs::exists(config_path)) {
    c = gpt2_config_from_hf_json(config_path);
    MT_CHECK(!n_head || *n_head == c.n_head, kFrom, "n_head {} was passed, but '{}' says n_head {}", *n_head,
             config_path, c.n_head);
  } else {
    c = infer_config(tensors, file, n_head);
  }
  if (dropout) c.dropout = *dropout;
  auto model = std::make_shared<GPT>(c, dtype);
  load_into(*model, tensors, file);
  model->eval();
  return model;
}

void save_hf_gpt2(const GPT& model, const std::string& safetensors_path) {
  const GPTConfig& c = model.config();
  MT_CHECK(c.bias, kSave, "'{}': GPT-2 checkpoints have biases, and this model was built with bias = false",
           safetensors_path);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : model.named_parameters()) {
    const Tensor v = is_conv1d_weight(name) ? t.detach().t() : t.detach();  // Conv1D: back to [in, out]
    tensors.emplace_back(name, v.to(DType::f32));
  }
  io::save_safetensors(safetensors_path, tensors, {{"format", "pt"}});

  // Sorted keys (nlohmann's default), as transformers writes them.
  const json config = {
      {"activation_function", "gelu_new"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", kLayerNormEps},
      {"model_type", "gpt2"},
      {"n_ctx", c.block_size},
      {"n_embd", c.n_embd},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"n_layer", c.n_layer},
      {"n_positions", c.block_size},
      {"resid_pdrop", c.dropout},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
      {"vocab_size", c.vocab_size},
  };
  detail::write_json_file(config_path_beside(safetensors_path), config, kSave);
}

}  // namespace memtrain::nn
