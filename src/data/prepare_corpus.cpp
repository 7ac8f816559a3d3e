// Corpus preparation: reading fortunes/text into documents, and documents -> tokenizer + token shards,
// skipped when a stamp shows the same inputs were already prepared.
#include "memtrain/data/prepare_corpus.h"

#include "data/text_file.h"
#include "io/atomic_file.h"
#include "memtrain/core/error.h"
#include "memtrain/core/philox.h"
#include "memtrain/data/bpe_tokenizer.h"
#include "memtrain/data/token_shard.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

namespace memtrain::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrepare = "prepare_corpus";
constexpr int kStampVersion = 1;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
}

// Lines of `text`, each with its '\n' (the last one may lack it).
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find('\n', pos);
    eol = eol == std::string_view::npos ? text.size() : eol + 1;
    lines.push_back(text.substr(pos, eol - pos));
    pos = eol;
  }
  return lines;
}

std::string_view strip_eol(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

bool has_percent_line(std::string_view text) {
  for (auto line : lines_of(text))
    if (strip_eol(line) == "%") return true;
  return false;
}

// Splits at separator lines (exactly "%" for fortunes, blank lines for paragraphs); blank documents go.
void split_documents(std::string_view text, bool fortunes, std::vector<std::string>& out) {
  std::string doc;
  auto flush = [&] {
    if (!is_blank(doc)) out.push_back(doc);
    doc.clear();
  };
  for (auto line : lines_of(text)) {
    const bool separator = fortunes ? strip_eol(line) == "%" : is_blank(line);
    if (separator) {
      flush();
    } else {
      doc.append(line);
    }
  }
  flush();
}

// FNV-1a, 64-bit: a content fingerprint for the stamp, not a security measure.
struct Fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  }
  std::string hex() const { return fmt::format("{:016x}", h); }
};

std::string hash_documents(const std::vector<std::string>& documents) {
  Fnv1a f;
  for (const auto& d : documents) {
    const std::uint64_t n = d.size();  // the length too, so ["ab", "c"] and ["a", "bc"] differ
    f.add(&n, sizeof(n));
    f.add(d.data(), d.size());
  }
  return f.hex();
}

std::string hash_file(const std::string& path) {
  const std::string bytes = detail::read_text_file(path, kPrepare);
  Fnv1a f;
  f.add(bytes.data(), bytes.size());
  return f.hex();
}

nlohmann::json make_stamp(const PrepareOptions& o, const std::vector<std::string>& documents,
                          const std::string& input_hash, const std::string& tokenizer_hash) {
  return {{"version", kStampVersion},     {"vocab_size", o.vocab_size},   {"val_fraction", o.val_fraction},
          {"seed", o.seed},               {"documents", documents.size()}, {"input_hash", input_hash},
          {"tokenizer_hash", tokenizer_hash}};
}

std::int64_t shard_size(const std::string& path) { return static_cast<std::int64_t>(TokenShard(path).size()); }

// The earlier result when the stamp matches `want` and every output is intact; anything unreadable
// (a missing or corrupt file) just means "prepare again".
bool try_reuse(const std::string& stamp_path, const nlohmann::json& want_without_tokenizer,
               const std::string& tokenizer_path, PreparedCorpus& result) {
  std::error_code ec;
  for (const auto& p : {stamp_path, tokenizer_path, result.train_shards[0], result.val_shards[0]})
    if (!fs::is_regular_file(p, ec)) return false;
  try {
    nlohmann::json want = want_without_tokenizer;
    want["tokenizer_hash"] = hash_file(tokenizer_path);
    const nlohmann::json stamp = nlohmann::json::parse(detail::read_text_file(stamp_path, kPrepare));
    for (const auto& [key, value] : want.items())
      if (!stamp.contains(key) || stamp[key] != value) return false;
    result.train_tokens = stamp.at("train_tokens").get<std::int64_t>();
    result.val_tokens = stamp.at("val_tokens").get<std::int64_t>();
    result.val_documents = stamp.at("val_documents").get<std::int64_t>();
    return shard_size(result.train_shards[0]) == result.train_tokens &&
           shard_size(result.val_shards[0]) == result.val_tokens;
  } catch (const std::exception&) {
    return false;
  }
}

void write_json(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  ::memtrain::detail::AtomicFileWriter out(path, kPrepare);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace

std::vector<std::string> read_fortunes(const std::string& dir) {
  constexpr const char* kWhere = "read_fortunes";
  std::error_code ec;
  MT_CHECK(fs::is_directory(dir, ec), kWhere, "'{}' is not a directory", dir);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;  // subdirectories such as "off/" are not entered
    names.push_back(name);
  }
  MT_CHECK(!ec, kWhere, "'{}': cannot list: {}", dir, ec.message());
  std::sort(names.begin(), names.end());
  std::vector<std::string> documents;
  for (const auto& name : names) {
    const std::string text = detail::read_text_file((fs::path(dir) / name).string(), kWhere);
    if (text.find('\0') != std::string::npos) continue;  // binary, not a fortunes file
    split_documents(text, /*fortunes=*/true, documents);
  }
  MT_CHECK(!documents.empty(), kWhere, "'{}': no fortunes found in {} candidate files", dir, names.size());
  return documents;
}

std::vector<std::string> read_documents(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return read_fortunes(path);
  const std::string text = detail::read_text_file(path, "read_documents");
  std::vector<std::string> documents;
  split_documents(text, has_percent_line(text), documents);
  MT_CHECK(!documents.empty(), "read_documents", "'{}': no non-blank document in {} bytes", path, text.size());
  return documents;
}

PreparedCorpus prepare_corpus(const std::vector<std::string>& documents, const std::string& out_dir,
                              const PrepareOptions& options) {
  MT_CHECK(options.vocab_size >= 257 && options.vocab_size <= 65536, kPrepare,
           "'{}': vocab_size {} is outside [257, 65536] (256 bytes + \"<|endoftext|>\", uint16 shard ids)", out_dir,
           options.vocab_size);
  MT_CHECK(std::isfinite(options.val_fraction) && options.val_fraction >= 0 && options.val_fraction <= 1, kPrepare,
           "'{}': val_fraction {} is outside [0, 1]", out_dir, options.val_fraction);
  MT_CHECK(documents.size() >= 2, kPrepare, "'{}': {} documents given; train and val need one each at least",
           out_dir, documents.size());
  MT_CHECK(!out_dir.empty(), kPrepare, "out_dir is empty");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  MT_CHECK(!ec && fs::is_directory(out_dir), kPrepare, "'{}': cannot create the directory: {}", out_dir,
           ec.message());

  const fs::path dir(out_dir);
  PreparedCorpus result;
  result.tokenizer_path = (dir / "tokenizer.json").string();
  result.train_shards = {(dir / "train_000.bin").string()};
  result.val_shards = {(dir / "val_000.bin").string()};
  result.documents = static_cast<std::int64_t>(documents.size());
  const std::string stamp_path = (dir / "prepared.json").string();
  const std::string input_hash = hash_documents(documents);
  nlohmann::json stamp = make_stamp(options, documents, input_hash, "");
  stamp.erase("tokenizer_hash");
  if (try_reuse(stamp_path, stamp, result.tokenizer_path, result)) {
    result.reused = true;
    return result;
  }

  // A tokenizer already in out_dir with the right size is used as is (it may have been supplied).
  std::optional<BpeTokenizer> tokenizer;
  if (fs::is_regular_file(result.tokenizer_path, ec)) {
    BpeTokenizer existing = BpeTokenizer::load(result.tokenizer_path);
    if (existing.vocab_size() == options.vocab_size) tokenizer = std::move(existing);
  }
  if (!tokenizer) {
    std::string corpus;
    for (const auto& d : documents) (corpus += d) += kEndOfText;
    tokenizer = BpeTokenizer::train(corpus, options.vocab_size);
    tokenizer->save(result.tokenizer_path);
  }

  // Document i goes to val when a Philox draw keyed by the seed is below val_fraction.
  const std::size_t n = documents.size();
  std::vector<double> u(n);
  std::vector<char> is_val(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = philox4x32_10(i, 0, options.seed).v[0] * 0x1p-32;
    is_val[i] = u[i] < options.val_fraction;
  }
  const auto val_count = std::count(is_val.begin(), is_val.end(), 1);
  if (val_count == 0) is_val[std::min_element(u.begin(), u.end()) - u.begin()] = 1;
  if (val_count == static_cast<std::ptrdiff_t>(n)) is_val[std::max_element(u.begin(), u.end()) - u.begin()] = 0;

  std::vector<std::uint16_t> train, val;
  for (std::size_t i = 0; i < n; ++i) {
    auto& out = is_val[i] ? val : train;
    for (std::int32_t id : tokenizer->encode(documents[i])) out.push_back(static_cast<std::uint16_t>(id));
    out.push_back(static_cast<std::uint16_t>(tokenizer->eot_token()));
    result.val_documents += is_val[i];
  }
  write_token_shard(result.train_shards[0], train);
  write_token_shard(result.val_shards[0], val);
  result.train_tokens = static_cast<std::int64_t>(train.size());
  result.val_tokens = static_cast<std::int64_t>(val.size());

  // The stamp goes last: it is what says the outputs are complete.
  stamp["tokenizer_hash"] = hash_file(result.tokenizer_path);
  stamp["train_tokens"] = result.train_tokens;
  stamp["val_tokens"] = result.val_tokens;
  stamp["val_documents"] = result.val_documents;
  write_json(stamp_path, stamp);
  return result;
}

}  // namespace memtrain::data
