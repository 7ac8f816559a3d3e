// Inputs the fuzzers of tests/fuzz/ found, as unit tests: each once crashed a reader (a sanitizer report or
// an out-of-memory) and must now be refused with an error naming the file. The minimised inputs are also
// committed under tests/fuzz/regressions/<target>/, where scripts/fuzz.sh replays them through the harness;
// here they are rebuilt byte by byte so the test needs no fuzz build.
#include "memtrain/core/tensor.h"
#include "memtrain/data/idx.h"
#include "memtrain/io/safetensors.h"

#include "error_text.h"
#include "temp_dir.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

namespace mt = memtrain;
using mt::test_support::error_of;
using mt::test_support::TempDir;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// 0, 0, type 0x08 (unsigned byte), the number of dims, each dim big-endian, then the data.
std::string idx_bytes(const std::vector<std::uint32_t>& dims, const std::string& data = "") {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xFF));
  return out + data;
}

std::string safetensors_bytes(const std::string& header) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return out + header;
}

void expect_message(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// fuzz_idx (tests/fuzz/regressions/idx/zero_dim_strides): a 0 dim made the element count 0, so the other
// dims passed the size check, and their product overflowed the tensor's int64 strides (UBSan, in
// Tensor::empty). The dims are now bounded with each 0 counted as 1.
TEST(FuzzRegressions, IdxZeroDimDoesNotExcuseHugeDims) {
  TempDir dir;
  const std::string p = dir.file("zero-dim-idx");
  write_bytes(p, idx_bytes({0, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}));
  expect_message(error_of([&] { mt::data::read_idx(p); }), {"read_idx", p, "implausible element count"});

  // An empty tensor of ordinary dims still reads.
  write_bytes(p, idx_bytes({0, 28, 28}));
  const mt::Tensor t = mt::data::read_idx(p);
  EXPECT_EQ(t.shape(), (mt::Shape{0, 28, 28}));
}

// fuzz_safetensors (tests/fuzz/regressions/safetensors/zero_dim_strides): the same overflow through a
// safetensors shape of 0 elements.
TEST(FuzzRegressions, SafetensorsZeroDimDoesNotExcuseHugeDims) {
  TempDir dir;
  const std::string p = dir.file("zero-dim.safetensors");
  write_bytes(p, safetensors_bytes(
                     R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"));
  expect_message(error_of([&] { mt::io::load_safetensors(p); }),
                 {"load_safetensors", p, "tensor 'w'", "[0,4294967296,4294967296]"});

  write_bytes(p, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0,4294967296],"data_offsets":[0,0]}})"));
  const auto loaded = mt::io::load_safetensors(p);
  EXPECT_EQ(loaded.at("w").shape(), (mt::Shape{0, 4294967296}));
}

// fuzz_idx_gz (tests/fuzz/regressions/idx_gz/huge_alloc, before compression): a 30-byte gzip file whose
// header claims 2 GB was allocated before its data was read (out of memory in the fuzzer). A gzip file
// now holds at most what deflate can expand it to.
TEST(FuzzRegressions, IdxGzipHeaderCannotClaimMoreThanTheFileHolds) {
  TempDir dir;
  const std::string p = dir.file("huge.gz");
  write_gz(p, std::string("\x00\x00\x08\x01\x79\x79\x6e\x79", 8));
  expect_message(error_of([&] { mt::data::read_idx(p); }), {"read_idx", p, "[2038001273]", "gzip file can hold"});
}

}  // namespace
