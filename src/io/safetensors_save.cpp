// save_safetensors: the header, then every tensor's bytes from its live buffer (through the bounded staging
// buffer where they are not one run of host memory), into an atomically written file.
#include "memtrain/io/safetensors.h"

#include "io/atomic_file.h"
#include "io/tensor_pieces.h"
#include "memtrain/core/state_arena.h"

#include <nlohmann/json.hpp>

#include <array>
#include <bit>
#include <set>

namespace memtrain::io {

static_assert(std::endian::native == std::endian::little, "safetensors bytes are written as stored in memory");

namespace {

constexpr const char* kSave = "save_safetensors";

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // nlohmann's ordered_json keeps the entries in the caller's order, which is the order of the data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(!name.empty() && name != "__metadata__", kSave, "'{}': invalid tensor name \"{}\"", path, name);
    MT_CHECK(seen.insert(name).second, kSave, "'{}': tensor name '{}' appears twice", path, name);
    MT_CHECK(t.defined(), kSave, "'{}': tensor '{}' is undefined", path, name);
    MT_CHECK(!t.device().is_meta(), kSave, "'{}': tensor '{}' is on the meta device, which holds no values", path,
             name);
    nlohmann::ordered_json e;
    e["dtype"] = std::string(safetensors_dtype_name(t.dtype()));
    e["shape"] = t.shape();
    e["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    header[name] = std::move(e);
  }
  std::string text = header.dump();
  // Pad with spaces to a multiple of 8 so the data section starts aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  detail::AtomicFileWriter out(path, kSave);
  out.reserve(8 + text.size() + offset);
  std::array<unsigned char, 8> len{};
  for (std::size_t i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  out.write(len.data(), len.size());
  out.write(text.data(), text.size());
  StagingBuffer staging;  // for tensors whose bytes are not contiguous in host memory
  for (const auto& entry : tensors) {
    const Tensor& t = entry.second;
    if (in_state_arena(t) && t.is_contiguous()) {
      // Offloaded optimizer state (core/state_arena.h): each piece goes back to its file once written, so the
      // save holds no more of the state than a step does.
      for_each_piece(t, static_cast<std::int64_t>(kStagingBytes / t.element_size()), [&](const Tensor& piece,
                                                                                           std::int64_t) {
        out.write(piece.data_ptr(), piece.nbytes());
        release_state_pages(piece);
      });
      continue;
    }
    if (contiguous_in_host_memory(t)) {
      if (t.nbytes() > 0) out.write(t.data_ptr(), t.nbytes());
      continue;
    }
    for_each_piece(t, static_cast<std::int64_t>(kStagingBytes / t.element_size()), [&](const Tensor& piece,
                                                                                         std::int64_t) {
      Tensor staged = staging.view(piece.shape(), t.dtype());
      staged.copy_(piece);
      out.write(staged.data_ptr(), staged.nbytes());
    });
  }
  out.commit();
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()), metadata);
}

void save_safetensors(const std::string& path, std::initializer_list<std::pair<std::string, Tensor>> tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors), metadata);
}
}  // namespace memtrain::io
