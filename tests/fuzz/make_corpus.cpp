// Writes the seed corpora of tests/fuzz/corpus/<target>/: valid files made by memtrain's own writers
// (save_safetensors, write_token_shard, BpeTokenizer::save, TrainerConfig::save) and fixtures, plus broken
// files mirroring the refusals the unit tests check, so each fuzzer starts next to every error path.
// Built in the fuzz build (cmake/memtrain_fuzz.cmake, after scripts/fuzz.sh configured it) and run by hand
// when a format changes:
//   cmake --build build-fuzz --target fuzz_make_corpus
//   build-fuzz/fuzz_make_corpus tests/fuzz/corpus tests/fixtures
// It writes into empty per-target directories only, so it never mixes with a corpus grown by a fuzz run.
#include "memtrain/core/tensor.h"
#include "memtrain/data/bpe_tokenizer.h"
#include "memtrain/data/token_shard.h"
#include "memtrain/io/safetensors.h"
#include "memtrain/train/trainer_config.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace memtrain;

namespace {

std::string g_root;  // tests/fuzz/corpus

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The path of seed `name` of `target`; the directory must be new or empty.
std::string seed(const std::string& target, const std::string& name) {
  const fs::path dir = fs::path(g_root) / target;
  fs::create_directories(dir);
  return (dir / name).string();
}

void write_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::ofstream f(seed(target, name), std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write seed " + target + "/" + name);
}

// `text` with the first `from` replaced by `to` (the broken variants of a valid file).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' not in the seed it should break");
  return text.replace(at, from.size(), to);
}

std::string gzip(const std::string& bytes) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::string out(deflateBound(&zs, static_cast<uLong>(bytes.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// ---- safetensors ------------------------------------------------------------------------------------

Tensor patterned(const Shape& shape, DType dtype, unsigned seed_value) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  unsigned x = seed_value * 2654435761u + 1;
  for (std::size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<unsigned char>(dtype == DType::boolean ? (x >> 20) & 1 : x >> 24);
  }
  return t;
}

// 8-byte little-endian header length, the header, the data: for the broken files no writer would make.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return out + header + data;
}

void safetensors_seeds() {
  const char* t = "safetensors";
  io::save_safetensors(seed(t, "f32_i32_metadata"),
                       {{"a", patterned({2}, DType::f32, 1)}, {"n", patterned({1}, DType::i32, 2)}},
                       {{"format", "pt"}});
  std::vector<std::pair<std::string, Tensor>> every;
  const DType dtypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2,
                          DType::i8,  DType::u8,  DType::i32, DType::i64,  DType::boolean};
  unsigned k = 0;
  for (DType d : dtypes) {
    every.emplace_back(std::string(io::safetensors_dtype_name(d)), patterned({2, 3}, d, ++k));
  }
  io::save_safetensors(seed(t, "every_dtype"), every);
  io::save_safetensors(seed(t, "empty_and_scalar"),
                       {{"empty", patterned({0, 4}, DType::f32, 3)}, {"scalar", patterned({}, DType::f64, 4)},
                        {"w", patterned({3, 2, 2}, DType::bf16, 5)}},
                       {{"format", "pt"}, {"step", "12"}});
  io::save_safetensors(seed(t, "no_tensors"), std::vector<std::pair<std::string, Tensor>>{}, {{"k", "v"}});
  // GPT-2-like names, as an HF checkpoint has them.
  io::save_safetensors(seed(t, "gpt2_names"), {{"wte.weight", patterned({8, 4}, DType::f16, 6)},
                                               {"h.0.attn.c_attn.weight", patterned({4, 12}, DType::f32, 7)},
                                               {"h.0.attn.bias", patterned({1, 1, 2, 2}, DType::u8, 8)}});

  // The refusals of tests/test_data_io.cpp (SafeTensors.BadInputNamesFileAndProblem).
  const std::string f32x2 = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_seed(t, "bad_too_short", "abc");
  std::string big = safetensors_bytes(f32x2, std::string(8, '\0'));
  big[0] = static_cast<char>(0xff);
  big[1] = static_cast<char>(0x7f);
  write_seed(t, "bad_header_length", big);
  write_seed(t, "bad_json", safetensors_bytes(R"({"w": {"dtype": )", ""));
  write_seed(t, "bad_array_header", safetensors_bytes("[1, 2]", ""));
  write_seed(t, "bad_dtype", safetensors_bytes(R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})",
                                               std::string(8, 0)));
  write_seed(t, "bad_no_dtype", safetensors_bytes(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, 0)));
  write_seed(t, "bad_past_data", safetensors_bytes(f32x2, std::string(6, 0)));
  write_seed(t, "bad_size", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                              std::string(8, 0)));
  write_seed(t, "bad_negative_dim", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                                                      std::string(8, 0)));
  write_seed(t, "bad_reversed_offsets",
             safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0)));
  write_seed(t, "bad_one_offset",
             safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 0)));
  write_seed(t, "bad_overlap", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                 R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
                                                 std::string(12, 0)));
  write_seed(t, "bad_metadata_value", safetensors_bytes(R"({"__metadata__":{"step":12}})", ""));
  write_seed(t, "bad_shape_overflow",
             safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                               std::string(8, 0)));
}

// ---- token shards -----------------------------------------------------------------------------------

std::string shard_bytes(std::int32_t magic, std::int32_t version, std::int32_t count,
                        const std::vector<std::uint16_t>& tokens) {
  std::string out(1024, '\0');
  auto put = [&](std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  put(0, static_cast<std::uint32_t>(magic));
  put(4, static_cast<std::uint32_t>(version));
  put(8, static_cast<std::uint32_t>(count));
  for (auto tok : tokens) {
    out.push_back(static_cast<char>(tok & 0xFF));
    out.push_back(static_cast<char>(tok >> 8));
  }
  return out;
}

void token_shard_seeds() {
  const char* t = "token_shard";
  data::write_token_shard(seed(t, "empty"), {});
  data::write_token_shard(seed(t, "five"), {5, 50256, 50257, 3, 60000});
  std::vector<std::uint16_t> many(300);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<std::uint16_t>((i * 40503u + 11u) % 50257u);
  data::write_token_shard(seed(t, "three_hundred"), many);
  // The refusals of TokenShard.BadInputNamesFileOffsetAndValues.
  const std::string full = shard_bytes(20240520, 1, 5, {1, 2, 3, 4, 5});
  write_seed(t, "bad_short", std::string(100, '\0'));
  write_seed(t, "bad_truncated", full.substr(0, full.size() - 2));
  write_seed(t, "bad_trailing", full + "zz");
  write_seed(t, "bad_magic", shard_bytes(12345, 1, 5, {1, 2, 3, 4, 5}));
  write_seed(t, "bad_version", shard_bytes(20240520, 2, 5, {1, 2, 3, 4, 5}));
  write_seed(t, "bad_negative_count", shard_bytes(20240520, 1, -3, {}));
}

// ---- IDX --------------------------------------------------------------------------------------------

std::string idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xFF));
  return out + data;
}

std::string counting_bytes(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 3);
  return s;
}

void idx_seeds() {
  const std::string labels = idx_bytes(0x08, {10}, counting_bytes(10));
  const std::string images = idx_bytes(0x08, {3, 4, 5}, counting_bytes(60));
  const std::string mnist = idx_bytes(0x08, {1, 28, 28}, counting_bytes(28 * 28));
  const std::string good = idx_bytes(0x08, {2, 3, 3}, counting_bytes(18));
  // The refusals of Idx.BadInputNamesFileAndOffset, before any gzip.
  const std::vector<std::pair<std::string, std::string>> raw = {
      {"labels", labels},
      {"images", images},
      {"mnist_one_image", mnist},
      {"bad_truncated_data", good.substr(0, good.size() - 5)},
      {"bad_truncated_dims", good.substr(0, 10)},
      {"bad_truncated_magic", good.substr(0, 2)},
      {"bad_magic", replaced(good, std::string("\0\0", 2), "\x12\x34")},
      {"bad_type_code", idx_bytes(0x0D, {2}, std::string(8, 0))},
      {"bad_trailing", good + "xy"},
      {"bad_zero_dims", idx_bytes(0x08, {}, "")},
  };
  for (const auto& [name, bytes] : raw) {
    write_seed("idx", name, bytes);
    write_seed("idx_gz", name, bytes);  // fuzz_idx_gz compresses its input itself
  }
  // fuzz_idx reads its input as is: gzip files too, including one cut short.
  write_seed("idx", "gz_labels", gzip(labels));
  write_seed("idx", "gz_images", gzip(images));
  const std::string gz = gzip(idx_bytes(0x08, {10, 28, 28}, counting_bytes(10 * 28 * 28)));
  write_seed("idx", "gz_bad_cut_short", gz.substr(0, gz.size() / 2));
}

// ---- tokenizers -------------------------------------------------------------------------------------

void bpe_seeds(const std::string& fixtures) {
  const std::string enc = read_file(fixtures + "/tokenizer/tiny_encoder.json");
  const std::string vocab = read_file(fixtures + "/tokenizer/tiny_vocab.bpe");
  // fuzz_bpe_gpt2's input: encoder.json, a NUL byte, vocab.bpe.
  auto pair = [&](const std::string& e, const std::string& v) { return e + std::string(1, '\0') + v; };
  const char* g = "bpe_gpt2";
  write_seed(g, "tiny", pair(enc, vocab));
  std::string crlf;
  for (char ch : vocab) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  write_seed(g, "tiny_crlf", pair(enc, crlf));
  // The refusals of TokenizerGpt2Files.BadFilesNameTheFileAndLine, and a broken encoder.
  write_seed(g, "bad_unknown_token", pair(enc, "#version: 0.2\nh e\nx yz\n"));
  write_seed(g, "bad_one_token", pair(enc, "#version: 0.2\nhe\n"));
  write_seed(g, "bad_short_merges", pair(enc, "#version: 0.2\n\xC4\xA0 t\nh e\n\xC4\xA0t he\ni s\n"));
  write_seed(g, "bad_no_eot", pair(replaced(enc, "<|endoftext|>", "<|end|>"), vocab));
  write_seed(g, "bad_encoder_array", pair("[1, 2]", vocab));

  const char* l = "bpe_load";
  const data::BpeTokenizer tiny = data::BpeTokenizer::train("aaabdaaabac", 260);
  tiny.save(seed(l, "trained_260"));
  data::BpeTokenizer::train("the cat sat on the mat; the cat ate 12 dates. <|endoftext|> caf\xc3\xa9 caf\xc3\xa9 it's",
                            280)
      .save(seed(l, "trained_280"));
  data::BpeTokenizer::from_gpt2_files(fixtures + "/tokenizer/tiny_encoder.json",
                                      fixtures + "/tokenizer/tiny_vocab.bpe")
      .save(seed(l, "gpt2_tiny"));
  // The refusals of TokenizerErrors.ClearMessages.
  const std::string good = read_file(seed(l, "trained_260"));
  write_seed(l, "bad_corrupt", "{\"format\": \"memtrain-bpe\", \"merges\": [[1, 2");
  write_seed(l, "bad_merge_result", replaced(good, "[256, 257, 258]", "[256, 257, 999]"));
  write_seed(l, "bad_format", "{\"format\": \"other\"}");
  write_seed(l, "bad_vocab_size", replaced(good, "\"vocab_size\": 260", "\"vocab_size\": 2147483647"));
}

// ---- configs ------------------------------------------------------------------------------------------

void trainer_config_seeds() {
  const char* t = "trainer_config";
  train::TrainerConfig{}.save(seed(t, "default"));
  train::TrainerConfig c;
  c.model = {.preset = "small", .seq_len = 128, .dropout = 0.1, .init_from = "gpt2.safetensors"};
  c.data.train = {"a.bin", "b.bin"};
  c.data.val = {"v.bin"};
  c.optimizer = optim::Spec::adamw8bit({.lr = 3e-4, .weight_decay = 0.05, .beta1 = 0.8, .beta2 = 0.95,
                                        .eps = 1e-6, .block_size = 128, .min_8bit_size = 1000});
  c.schedule = {.warmup_steps = 7, .min_lr_ratio = 0.25, .decay = train::LrDecay::constant};
  c.grad_accum = 4;
  c.world_size = 2;
  c.zero = 1;
  c.checkpoint_interval = 9;
  c.checkpoint_dir = "ckpts";
  c.memory_budget_bytes = std::size_t{123456789};
  c.activation_checkpointing = ckpt::Policy::parse("budget:64MiB");
  c.galore_rank = 16;
  c.galore_proj_type = optim::GaLoreProjType::reverse_std_side;
  c.galore_svd = optim::GaLoreSvd::exact;
  c.galore_targets = {"*.w_in.weight"};
  c.precision = amp::Precision::fp16;
  c.loss_scaler = {.init_scale = 512, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 7,
                   .min_scale = 2, .max_scale = 8192};
  c.save(seed(t, "every_field"));
  c.optimizer = optim::Spec::adafactor();
  c.precision = amp::Precision::fp8;
  c.fp8_scaling = amp::Fp8ScalingKind::delayed;
  c.device = Device::cuda(1);
  c.activation_checkpointing = ckpt::Policy::parse("every:2");
  c.save(seed(t, "adafactor_fp8"));
  c.optimizer = optim::Spec::lion8bit();
  c.activation_checkpointing = ckpt::Policy::parse("selective");
  c.save(seed(t, "lion8bit"));
  c.optimizer = optim::Spec::sgd();
  c.save(seed(t, "sgd"));
  // Refusals: bad JSON, an unknown key, wrong types, bad names.
  write_seed(t, "bad_json", "{\"max_steps\": 5,");
  write_seed(t, "bad_typo", "{\"max_stepz\": 5}");
  write_seed(t, "bad_types", R"({"micro_batch": 8.5, "grad_clip": true, "seed": -1})");
  write_seed(t, "bad_names", R"({"precision": "fp64", "device": "tpu", "schedule": {"decay": "linear"}})");
  write_seed(t, "bad_array", "[]");
}

void hf_config_seeds(const std::string& fixtures) {
  const char* t = "hf_config";
  const std::string good = read_file(fixtures + "/hf_gpt2/config.json");
  write_seed(t, "fixture", good);
  // The refusals of HfGpt2.BadConfigsNameFileAndKey.
  write_seed(t, "bad_activation", replaced(good, "\"gelu_new\"", "\"relu\""));
  write_seed(t, "bad_epsilon", replaced(good, "1e-05", "1e-06"));
  write_seed(t, "bad_n_head", replaced(good, "\"n_head\": 4", "\"n_head\": 5"));
  write_seed(t, "bad_missing_n_head", replaced(good, "\"n_head\": 4,", ""));
  write_seed(t, "bad_n_inner", replaced(good, "\"n_inner\": null", "\"n_inner\": 64"));
  write_seed(t, "bad_array", replaced(good, "{", "["));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR FIXTURES_DIR (tests/fuzz/corpus tests/fixtures)\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  for (const char* target : {"safetensors", "token_shard", "idx", "idx_gz", "bpe_gpt2", "bpe_load",
                             "trainer_config", "hf_config"}) {
    const fs::path dir = fs::path(g_root) / target;
    if (fs::exists(dir) && !fs::is_empty(dir)) {
      std::fprintf(stderr, "%s is not empty: remove it to write fresh seeds\n", dir.c_str());
      return 1;
    }
  }
  try {
    safetensors_seeds();
    token_shard_seeds();
    idx_seeds();
    bpe_seeds(argv[2]);
    trainer_config_seeds();
    hf_config_seeds(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
