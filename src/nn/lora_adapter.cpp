// PEFT's adapter files: names mapped between memtrain's module paths and the HF model's, the config's keys
// checked, and the tensors checked all at once before any is copied.
#include "memtrain/nn/lora_adapter.h"

#include "io/atomic_file.h"
#include "io/json_file.h"
#include "memtrain/autograd/grad_mode.h"
#include "memtrain/core/error.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/llama.h"
#include "memtrain/nn/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace memtrain::nn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSave = "save_lora_adapter";
constexpr const char* kLoad = "load_lora_adapter";
constexpr std::string_view kKeyPrefix = "base_model.model.";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
constexpr const char* kConfigFile = "adapter_config.json";

std::string weights_path(const std::string& dir) { return (fs::path(dir) / kWeightsFile).string(); }
std::string config_path(const std::string& dir) { return (fs::path(dir) / kConfigFile).string(); }

// The HF model's prefix for a module path of this model ("" for paths HF keeps as they are).
std::string hf_prefix(const Module& model, const std::string& path) {
  if (dynamic_cast<const GPT*>(&model) != nullptr) return "transformer.";
  if (dynamic_cast<const Llama*>(&model) != nullptr) return path == "lm_head" ? "" : "model.";
  return "";
}

std::string file_key(const Module& model, const std::string& path, const char* which) {
  return fmt::format("{}{}.{}.weight", kKeyPrefix, hf_module_path(model, path), which);
}

// The setting `key` of adapter_config.json as T, or `fallback` when absent or null; a wrong type names the key.
template <typename T>
T setting(const json& j, const char* key, T fallback, const std::string& path) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    detail::throw_error(kLoad, fmt::format("'{}': \"{}\" has the wrong type: {}", path, key, j.at(key).dump()));
  }
}

bool empty_setting(const json& j, const char* key) {
  return !j.contains(key) || j.at(key).is_null() || (j.at(key).is_structured() && j.at(key).empty());
}

}  // namespace

std::string hf_module_path(const Module& model, const std::string& path) { return hf_prefix(model, path) + path; }

void save_lora_adapter(const Module& model, const LoraConfig& config, const std::string& dir) {
  config.validate();
  const NamedLinears layers = lora_layers(model);
  MT_CHECK(!layers.empty(), kSave, "the model has no LoRA adapter to save");
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::string> targets;
  for (const auto& [path, layer] : layers) {
    MT_CHECK(!layer->lora_merged(), kSave, "'{}': the adapter is merged into the weight; unmerge it first", path);
    MT_CHECK(layer->lora_settings().rank == config.rank, kSave, "'{}' has rank {}, the config says {}", path,
             layer->lora_settings().rank, config.rank);
    tensors.emplace_back(file_key(model, path, "lora_A"), layer->lora_A()->weight().detach());
    tensors.emplace_back(file_key(model, path, "lora_B"), layer->lora_B()->weight().detach());
    targets.push_back(hf_module_path(model, path));
  }
  detail::require_writable_dir(dir, kSave, "the adapter directory");
  io::save_safetensors(weights_path(dir), tensors, {{"format", "pt"}});
  const json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", config.rank},
      {"lora_alpha", config.alpha},
      {"lora_dropout", config.dropout},
      {"use_rslora", config.rslora},
      {"bias", "none"},
      {"target_modules", targets},
      // GPT-2's layers are HF Conv1D ([in, out] weights); PEFT keeps A and B nn.Linear-shaped either way.
      {"fan_in_fan_out", dynamic_cast<const GPT*>(&model) != nullptr},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"base_model_name_or_path", nullptr},
      {"use_dora", false},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
  };
  detail::write_json_file(config_path(dir), j, kSave);
}

namespace {

// read_lora_adapter_config over the file's tensors, already loaded.
LoraConfig config_for(const Module& model, const std::string& dir, const std::map<std::string, Tensor>& tensors) {
  const std::string path = config_path(dir);
  const json j = detail::read_json_object_file(path, kLoad);
  const auto type = setting<std::string>(j, "peft_type", "LORA", path);
  MT_CHECK(type == "LORA", kLoad, "'{}': peft_type '{}': only LORA adapters are read", path, type);
  const auto bias = setting<std::string>(j, "bias", "none", path);
  MT_CHECK(bias == "none", kLoad, "'{}': bias '{}': adapters that train biases are not read (bias must be \"none\")",
           path, bias);
  MT_CHECK(!setting<bool>(j, "use_dora", false, path), kLoad, "'{}': use_dora: DoRA adapters are not read", path);
  for (const char* key : {"modules_to_save", "rank_pattern", "alpha_pattern"})
    MT_CHECK(empty_setting(j, key), kLoad, "'{}': \"{}\" is set ({}): only one rank and alpha for every layer, and "
             "no fully trained modules, are read", path, key, j.at(key).dump());
  LoraConfig c;
  MT_CHECK(j.contains("r"), kLoad, "'{}': missing \"r\"", path);
  c.rank = setting<std::int64_t>(j, "r", 0, path);
  MT_CHECK(c.rank > 0, kLoad, "'{}': \"r\" must be positive, got {}", path, c.rank);
  c.alpha = setting<double>(j, "lora_alpha", 8.0, path);
  c.dropout = setting<double>(j, "lora_dropout", 0.0, path);
  c.rslora = setting<bool>(j, "use_rslora", false, path);

  // The layers come from the tensors: each "<prefix><HF path>.lora_A.weight" must be one of the model's Linears.
  std::map<std::string, std::string> by_key;  // file key -> model path
  for (const auto& [p, layer] : named_linears(model)) {
    by_key.emplace(file_key(model, p, "lora_A"), p);
    by_key.emplace(file_key(model, p, "lora_B"), p);
  }
  std::vector<std::string> unknown;
  std::set<std::string> layers;
  for (const auto& [key, value] : tensors) {
    const auto found = by_key.find(key);
    if (found == by_key.end()) unknown.push_back(key);
    else layers.insert(found->second);
  }
  c.targets.assign(layers.begin(), layers.end());
  MT_CHECK(unknown.empty(), kLoad, "'{}': tensors that are no lora_A / lora_B weight of the model's Linears: {}",
           weights_path(dir), fmt::join(unknown, ", "));
  MT_CHECK(!c.targets.empty(), kLoad, "'{}' holds no adapter tensor", weights_path(dir));
  try {
    c.validate();
  } catch (const Error& e) {
    MT_CHECK(false, kLoad, "'{}': {}", path, e.what());
  }
  return c;
}

}  // namespace

LoraConfig read_lora_adapter_config(const Module& model, const std::string& dir) {
  return config_for(model, dir, io::load_safetensors(weights_path(dir)));
}

void load_lora_adapter(Module& model, const std::string& dir) {
  std::map<std::string, Tensor> tensors = io::load_safetensors(weights_path(dir));
  const LoraConfig c = config_for(model, dir, tensors);
  const NamedLinears layers = lora_layers(model);
  MT_CHECK(!layers.empty(), kLoad, "the model has no LoRA adapters to load '{}' into (apply_lora first)", dir);
  std::vector<std::string> problems, missing;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  for (const auto& [path, layer] : layers) {
    const LoraSettings& s = layer->lora_settings();
    if (s.rank != c.rank || std::abs(s.scaling - c.scaling()) > 1e-12 * std::abs(c.scaling()))
      problems.push_back(fmt::format("'{}' has rank {} and scaling {}, the file's config r {} and scaling {}", path,
                                     s.rank, s.scaling, c.rank, c.scaling()));
    for (const auto& [which, dest] : {std::pair{"lora_A", layer->lora_A()->weight()},
                                      std::pair{"lora_B", layer->lora_B()->weight()}}) {
      const std::string key = file_key(model, path, which);
      const auto found = tensors.find(key);
      if (found == tensors.end()) {
        missing.push_back(key);
        continue;
      }
      if (found->second.shape() != dest.shape() || !is_floating(found->second.dtype()))
        problems.push_back(fmt::format("{}: the file has {} {}, the model {}", key, shape_str(found->second.shape()),
                                       dtype_name(found->second.dtype()), shape_str(dest.shape())));
      copies.emplace_back(dest, found->second);
      tensors.erase(found);
    }
  }
  if (!missing.empty()) problems.push_back(fmt::format("missing: {}", fmt::join(missing, ", ")));
  std::vector<std::string> unexpected;
  for (const auto& [key, t] : tensors) unexpected.push_back(key);
  if (!unexpected.empty())
    problems.push_back(fmt::format("for layers without an adapter in the model: {}", fmt::join(unexpected, ", ")));
  MT_CHECK(problems.empty(), kLoad, "'{}' does not fit the model's adapters: {}", dir, fmt::join(problems, "; "));
  autograd::NoGradGuard no_grad;
  for (auto& [dest, src] : copies) {
    Tensor d = dest;
    d.copy_(src);
  }
}

}  // namespace memtrain::nn
