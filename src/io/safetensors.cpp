// safetensors reader. The header is parsed into a list of entries and fully validated (offsets inside the data
// section, sizes matching shape x dtype, no overlaps) before any tensor is allocated. Only this reader's TU is in
// the readers' fuzz harness (cmake/memtrain_fuzz.cmake): io::SafetensorsFile (safetensors_file.cpp) and the
// writer (safetensors_save.cpp) reach the tensor copies, which the harness does not link.
#include "memtrain/io/safetensors.h"

#include "io/atomic_file.h"  // read_exact_at
#include "io/json_limits.h"
#include "io/safetensors_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace memtrain::io {

namespace {

// The reference implementation refuses headers over 100 MB; so do we, before allocating one.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

constexpr std::array<std::pair<DType, std::string_view>, kNumDTypes> kDTypeNames{{
    {DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::f8_e4m3, "F8_E4M3"}, {DType::f8_e5m2, "F8_E5M2"}, {DType::i8, "I8"}, {DType::u8, "U8"},
    {DType::i32, "I32"}, {DType::i64, "I64"}, {DType::boolean, "BOOL"},
}};

std::string json_type(const nlohmann::json& j) { return j.type_name(); }

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j,
                  std::uint64_t data_bytes) {
  MT_CHECK(j.is_object(), kLoad, "'{}': tensor '{}': entry is a JSON {}, expected an object", path, name,
           json_type(j));
  Entry e;
  e.name = name;
  auto dt = j.find("dtype");
  MT_CHECK(dt != j.end() && dt->is_string(), kLoad, "'{}': tensor '{}': missing or non-string \"dtype\"", path,
           name);
  auto dtype = dtype_from_safetensors(dt->get<std::string>());
  MT_CHECK(dtype.has_value(), kLoad, "'{}': tensor '{}': unknown dtype \"{}\"", path, name,
           dt->get<std::string>());
  e.dtype = *dtype;

  auto sh = j.find("shape");
  MT_CHECK(sh != j.end() && sh->is_array(), kLoad, "'{}': tensor '{}': missing or non-array \"shape\"", path, name);
  std::uint64_t numel = 1;
  // The product with each 0 counted as 1, which a contiguous tensor's strides reach: it must fit int64 too, or
  // [0, 2^32, 2^32] (numel 0) overflows Tensor::empty's strides (found by tests/fuzz/fuzz_safetensors.cpp).
  std::uint64_t span = 1;
  for (const auto& d : *sh) {
    MT_CHECK(d.is_number_unsigned(), kLoad, "'{}': tensor '{}': shape entry {} is not a non-negative integer",
             path, name, d.dump());
    auto v = d.get<std::uint64_t>();
    // Each dimension and their product must fit int64 (a 0 elsewhere does not excuse a huge dimension).
    MT_CHECK(v <= static_cast<std::uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, v, &numel) &&
                 numel <= static_cast<std::uint64_t>(INT64_MAX) &&
                 !__builtin_mul_overflow(span, std::max<std::uint64_t>(v, 1), &span) &&
                 span <= static_cast<std::uint64_t>(INT64_MAX),
             kLoad,
             "'{}': tensor '{}': shape {} has more than 2^63 - 1 elements", path, name, sh->dump());
    e.shape.push_back(static_cast<std::int64_t>(v));
  }

  auto off = j.find("data_offsets");
  MT_CHECK(off != j.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
               (*off)[1].is_number_unsigned(),
           kLoad, "'{}': tensor '{}': \"data_offsets\" must be two non-negative integers, got {}", path, name,
           off == j.end() ? std::string("nothing") : off->dump());
  e.begin = (*off)[0].get<std::uint64_t>();
  e.end = (*off)[1].get<std::uint64_t>();
  MT_CHECK(e.begin <= e.end, kLoad, "'{}': tensor '{}': data_offsets [{}, {}] end before they begin", path, name,
           e.begin, e.end);
  MT_CHECK(e.end <= data_bytes, kLoad,
           "'{}': tensor '{}': data_offsets [{}, {}] run past the data section of {} bytes", path, name, e.begin,
           e.end, data_bytes);
  std::uint64_t want = 0;
  bool overflow = __builtin_mul_overflow(numel, dtype_size(e.dtype), &want);
  MT_CHECK(!overflow && want == e.end - e.begin, kLoad,
           "'{}': tensor '{}': data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} x {} bytes", path,
           name, e.begin, e.end, e.end - e.begin, shape_str(e.shape), safetensors_dtype_name(e.dtype), numel,
           dtype_size(e.dtype));
  return e;
}

Header read_header(const std::string& path, int fd) {
  struct stat st {};
  MT_CHECK(::fstat(fd, &st) == 0, kLoad, "'{}': stat failed: {}", path, std::strerror(errno));
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  MT_CHECK(file_size >= 8, kLoad, "'{}': file is {} bytes, too short for the 8-byte header length at offset 0",
           path, file_size);
  std::array<unsigned char, 8> len_bytes{};
  MT_CHECK(detail::read_exact_at(fd, len_bytes.data(), 8, 0, kLoad, path), kLoad,
           "'{}': file ended while reading the header length at offset 0", path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[static_cast<std::size_t>(i)];
  MT_CHECK(n <= file_size - 8, kLoad,
           "'{}': header length {} (at offset 0) exceeds the {} bytes that follow it in the {}-byte file", path, n,
           file_size - 8, file_size);
  MT_CHECK(n <= kMaxHeaderBytes, kLoad, "'{}': header length {} (at offset 0) is over the {}-byte limit", path, n,
           kMaxHeaderBytes);

  std::string text(n, '\0');
  MT_CHECK(detail::read_exact_at(fd, text.data(), n, 8, kLoad, path), kLoad,
           "'{}': file ended inside the {}-byte header at offset 8", path, n);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, detail::json_depth_limit(kLoad, path));
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 within the header text, which starts at file offset 8.
    detail::throw_error(kLoad, fmt::format("'{}': header JSON does not parse near file offset {}: {}", path,
                                           8 + (e.byte > 0 ? e.byte - 1 : 0), e.what()));
  }
  MT_CHECK(j.is_object(), kLoad, "'{}': header (offset 8) is a JSON {}, expected an object", path, json_type(j));

  Header h;
  h.data_start = 8 + n;
  const std::uint64_t data_bytes = file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      MT_CHECK(it->is_object(), kLoad, "'{}': \"__metadata__\" is a JSON {}, expected an object", path,
               json_type(*it));
      for (auto m = it->begin(); m != it->end(); ++m) {
        MT_CHECK(m->is_string(), kLoad, "'{}': metadata \"{}\" is a JSON {}, expected a string", path, m.key(),
                 json_type(*m));
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, it.key(), *it, data_bytes));
  }

  // Overlap check: sorted by begin, each tensor must start at or after the previous one's end.
  std::vector<const Entry*> by_begin;
  for (const auto& e : h.entries) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (std::size_t i = 1; i < by_begin.size(); ++i) {
    const Entry& a = *by_begin[i - 1];
    const Entry& b = *by_begin[i];
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (a.begin == a.end || b.begin == b.end) continue;
    MT_CHECK(b.begin >= a.end, kLoad, "'{}': tensor '{}' data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", path,
             b.name, b.begin, b.end, a.name, a.begin, a.end);
  }
  return h;
}

}  // namespace

Header open_and_read_header(const std::string& path, Fd& fd) {
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd.fd >= 0, kLoad, "'{}': cannot open: {}", path, std::strerror(errno));
  return read_header(path, fd.fd);
}

void read_bytes(const std::string& path, int fd, const Header& h, const Entry& e, void* data, std::uint64_t bytes,
                std::uint64_t first_byte) {
  const std::uint64_t at = h.data_start + e.begin + first_byte;
  MT_CHECK(detail::read_exact_at(fd, data, bytes, at, kLoad, path), kLoad,
           "'{}': tensor '{}': file ended while reading its data at offset {}", path, e.name, at);
}

Tensor read_whole(const std::string& path, int fd, const Header& h, const Entry& e) {
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) read_bytes(path, fd, h, e, t.data_ptr(), e.end - e.begin, 0);
  return t;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& [d, name] : kDTypeNames)
    if (d == dtype) return name;
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& [d, n] : kDTypeNames)
    if (n == name) return d;
  return std::nullopt;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  Fd fd;
  const Header h = open_and_read_header(path, fd);
  std::map<std::string, Tensor> out;
  for (const Entry& e : h.entries) out.emplace(e.name, read_whole(path, fd.fd, h, e));
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  Fd fd;
  return open_and_read_header(path, fd).metadata;
}

}  // namespace memtrain::io
