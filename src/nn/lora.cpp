// LoRA: choosing the Linears by name, adding their adapters, freezing the rest.
#include "memtrain/nn/lora.h"

#include "memtrain/core/error.h"
#include "memtrain/core/name_glob.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string_view>

namespace memtrain::nn {

namespace {

constexpr const char* kWhere = "LoRA";

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// A path with an all-digit component: the layer sits inside a numbered block.
bool inside_numbered_block(std::string_view path) {
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t dot = std::min(path.find('.', start), path.size());
    if (all_digits(path.substr(start, dot - start))) return true;
    start = dot + 1;
  }
  return false;
}

// PEFT's rule (the path, or its last components after a dot), or a glob over the whole path.
bool pattern_matches(std::string_view pattern, std::string_view path) {
  if (pattern.find('*') != std::string_view::npos) return name_glob_matches(pattern, path);
  if (path == pattern) return true;
  return path.size() > pattern.size() && path.substr(path.size() - pattern.size()) == pattern &&
         path[path.size() - pattern.size() - 1] == '.';
}

void collect_linears(const std::string& prefix, const Module& m, std::set<const Module*>& seen, NamedLinears& out) {
  for (const auto& [name, child] : m.named_children()) {
    if (!seen.insert(child.get()).second) continue;
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (auto linear = std::dynamic_pointer_cast<Linear>(child)) {
      out.emplace_back(path, linear);
      continue;  // its children are its own adapter's A and B
    }
    collect_linears(path, *child, seen, out);
  }
}

}  // namespace

NamedLinears named_linears(const Module& model) {
  NamedLinears out;
  std::set<const Module*> seen;
  collect_linears("", model, seen, out);
  return out;
}

NamedLinears lora_targets(const Module& model, const LoraConfig& config) {
  const NamedLinears all = named_linears(model);
  std::vector<std::string> paths;
  for (const auto& [path, layer] : all) paths.push_back(path);
  NamedLinears chosen;
  if (config.targets.empty()) {
    for (const auto& entry : all)
      if (inside_numbered_block(entry.first)) chosen.push_back(entry);
    MT_CHECK(!chosen.empty(), kWhere,
             "no Linear sits inside a numbered block, where the default targets look; name them with targets. The "
             "model's Linears: [{}]",
             fmt::join(paths, ", "));
    return chosen;
  }
  for (const std::string& pattern : config.targets) {
    const bool any = std::any_of(all.begin(), all.end(), [&](const auto& e) { return pattern_matches(pattern, e.first); });
    MT_CHECK(any, kWhere, "target '{}' matches no Linear of the model. Its Linears: [{}]", pattern,
             fmt::join(paths, ", "));
  }
  for (const auto& entry : all)
    if (std::any_of(config.targets.begin(), config.targets.end(),
                    [&](const std::string& p) { return pattern_matches(p, entry.first); }))
      chosen.push_back(entry);
  return chosen;
}

NamedLinears apply_lora(Module& model, const LoraConfig& config, DType base_dtype) {
  config.validate();
  MT_CHECK(config.enabled(), kWhere, "rank is 0: LoRA is off");
  MT_CHECK(is_floating(base_dtype), kWhere, "the frozen weights' dtype must be floating, got {}",
           dtype_name(base_dtype));
  const NamedLinears chosen = lora_targets(model, config);
  for (const auto& [path, layer] : chosen) {
    MT_CHECK(!layer->has_lora(), kWhere, "'{}' has a LoRA adapter already", path);
    const std::int64_t n = layer->in_features() * layer->out_features();
    MT_CHECK(!config.quantize_nf4 || n % ops::kNf4BlockSize == 0, kWhere,
             "'{}' [{}, {}] has {} weights, not a multiple of NF4's block of {}: leave it out of the targets, or "
             "train it without quantize_nf4", path, layer->out_features(), layer->in_features(), n,
             ops::kNf4BlockSize);
  }
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor frozen = p;
    frozen.set_requires_grad(false);
    frozen.set_grad(Tensor());
  }
  const LoraSettings settings{config.rank, config.scaling(), config.dropout, config.quantize_nf4};
  for (const auto& [path, layer] : chosen) layer->add_lora(settings, base_dtype);
  return chosen;
}

NamedLinears lora_layers(const Module& model) {
  NamedLinears out;
  for (auto& entry : named_linears(model))
    if (entry.second->has_lora()) out.push_back(std::move(entry));
  return out;
}

void merge_lora(Module& model) {
  if (auto* layer = dynamic_cast<Linear*>(&model)) return layer->merge_lora();
  const NamedLinears layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "nn::merge_lora", "the model has no LoRA adapter");
  for (const auto& [path, layer] : layers) layer->merge_lora();
}

void unmerge_lora(Module& model) {
  if (auto* layer = dynamic_cast<Linear*>(&model)) return layer->unmerge_lora();
  const NamedLinears layers = lora_layers(model);
  MT_CHECK(!layers.empty(), "nn::unmerge_lora", "the model has no LoRA adapter");
  for (const auto& [path, layer] : layers) layer->unmerge_lora();
}

}  // namespace memtrain::nn
