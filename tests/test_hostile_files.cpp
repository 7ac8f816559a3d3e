// What a crafted file can make a reader do is bounded: a length beyond the file, an element count beyond
// int64 or beyond what the bytes can hold, and JSON nested deeper than any real file are each refused with
// an error naming the file, before anything of that size is allocated and before anything recurses that deep.
// (The fuzzers in tests/fuzz/ search for the cases nobody thought of; these are the ones somebody did.)
#include "memtrain/data/bpe_tokenizer.h"
#include "memtrain/data/idx.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/nn/hf_gpt2.h"
#include "memtrain/train/trainer_config.h"

#include "error_text.h"
#include "temp_dir.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace mt = memtrain;
using mt::test_support::error_of;
using mt::test_support::TempDir;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian `length`, then the header text, then the data.
std::string safetensors_bytes(std::uint64_t length, const std::string& header, const std::string& data = "") {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  return out + header + data;
}
std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  return safetensors_bytes(header.size(), header, data);
}

// `levels` arrays, one inside the other, around `inner`.
std::string nested(int levels, const std::string& inner = "1") {
  return std::string(static_cast<std::size_t>(levels), '[') + inner + std::string(static_cast<std::size_t>(levels), ']');
}

// Far deeper than the limit, and deep enough that one recursion per level (as json::dump does) would
// overflow an 8 MiB stack.
constexpr int kDeep = 1'000'000;

void expect_refused(const std::string& msg, std::initializer_list<std::string> fragments) {
  for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

TEST(HostileFiles, SafetensorsHeaderLengthBeyondTheFileIsRefusedBeforeAllocating) {
  TempDir dir;
  const std::string p = dir.file("h.safetensors");
  // Were the header buffer allocated first, this would be a std::length_error or bad_alloc, not an Error.
  write_bytes(p, safetensors_bytes(0xFFFF'FFFF'FFFF'FFF0ull, "{}"));
  expect_refused(error_of([&] { mt::io::load_safetensors(p); }),
                 {p, "header length 18446744073709551600", "exceeds the 2 bytes"});
  write_bytes(p, safetensors_bytes(1'000'000'000, std::string(16, ' ')));
  expect_refused(error_of([&] { mt::io::load_safetensors_metadata(p); }), {p, "header length 1000000000", "exceeds"});
}

TEST(HostileFiles, SafetensorsElementCountsBeyondInt64OrTheDataAreRefused) {
  TempDir dir;
  const std::string p = dir.file("s.safetensors");
  const auto load = [&](const std::string& shape, const std::string& dtype = "U8") {
    write_bytes(p, safetensors_bytes(R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape +
                                         R"(,"data_offsets":[0,8]}})",
                                     std::string(8, '\0')));
    return error_of([&] { mt::io::load_safetensors(p); });
  };
  // 2^64 elements: overflows even uint64.
  expect_refused(load("[4294967296,4294967296]"), {p, "tensor 'w'", "more than 2^63 - 1 elements"});
  // 3 x 2^62 fits uint64 but not int64.
  expect_refused(load("[4611686018427387904,3]"), {p, "tensor 'w'", "more than 2^63 - 1 elements"});
  // One dimension past int64, with a 0 elsewhere: no elements, but the dimension cannot be held.
  expect_refused(load("[0,9223372036854775808]"), {p, "tensor 'w'", "more than 2^63 - 1 elements"});
  // Fits int64, but its bytes overflow: 2^62 x 4 bytes.
  expect_refused(load("[4611686018427387904]", "F32"), {p, "tensor 'w'", "hold 8 bytes"});
  // Fits, but the 8 bytes hold fewer.
  expect_refused(load("[3,3]"), {p, "tensor 'w'", "hold 8 bytes", "[3, 3]"});
}

TEST(HostileFiles, DeeplyNestedJsonIsRefusedInEveryReader) {
  TempDir dir;
  // safetensors: the nesting inside a shape entry (whose error message would quote it).
  const std::string st = dir.file("n.safetensors");
  write_bytes(st, safetensors_bytes(R"({"w":{"dtype":"F32","shape":)" + nested(kDeep) + R"(,"data_offsets":[0,0]}})"));
  expect_refused(error_of([&] { mt::io::load_safetensors(st); }), {"load_safetensors", st, "nested deeper than 64"});
  expect_refused(error_of([&] { mt::io::load_safetensors_metadata(st); }), {st, "nested deeper than 64"});

  const std::string config = dir.file("run.json");
  write_bytes(config, R"({"model":)" + nested(kDeep) + "}");
  expect_refused(error_of([&] { mt::train::TrainerConfig::load(config); }),
                 {"TrainerConfig::load", config, "nested deeper than 64"});

  const std::string hf = dir.file("config.json");
  write_bytes(hf, R"({"n_embd":)" + nested(kDeep) + "}");
  expect_refused(error_of([&] { mt::nn::gpt2_config_from_hf_json(hf); }), {hf, "nested deeper than 64"});

  const std::string tok = dir.file("tok.json");
  write_bytes(tok, nested(kDeep));
  expect_refused(error_of([&] { mt::data::BpeTokenizer::load(tok); }), {"BpeTokenizer::load", tok, "nested deeper than 64"});

  const std::string encoder = dir.file("encoder.json"), merges = dir.file("vocab.bpe");
  write_bytes(encoder, R"({"a":)" + nested(kDeep) + "}");
  write_bytes(merges, "#version: 0.2\n");
  expect_refused(error_of([&] { mt::data::BpeTokenizer::from_gpt2_files(encoder, merges); }),
                 {encoder, "nested deeper than 64"});
}

TEST(HostileFiles, JsonJustWithinTheDepthLimitStillParses) {
  TempDir dir;
  // 64 levels in all: the object, then 63 arrays. The reader then refuses the value for what it is, not for
  // its depth.
  const std::string config = dir.file("run.json");
  write_bytes(config, R"({"model":)" + nested(63) + "}");
  const std::string msg = error_of([&] { mt::train::TrainerConfig::load(config); });
  EXPECT_EQ(msg.find("nested deeper"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model"), std::string::npos) << msg;
  write_bytes(config, R"({"model":)" + nested(64) + "}");
  EXPECT_NE(error_of([&] { mt::train::TrainerConfig::load(config); }).find("nested deeper than 64"), std::string::npos);
}

TEST(HostileFiles, GzipIdxClaimingMoreThanItsBytesCanHoldIsRefusedBeforeAllocating) {
  TempDir dir;
  const std::string p = dir.file("bomb.gz");
  // A header claiming 2^20 x 2^20 bytes (a TiB), compressed into a few dozen bytes.
  const std::string header = {0, 0, 0x08, 2, 0, 0x10, 0, 0, 0, 0x10, 0, 0};
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, header.data(), static_cast<unsigned>(header.size())), static_cast<int>(header.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
  expect_refused(error_of([&] { mt::data::read_idx(p); }),
                 {p, "[1048576, 1048576]", "1099511627788 bytes after decompression", "gzip file can hold"});
}

}  // namespace
