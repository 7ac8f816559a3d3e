// BpeTokenizer files: memtrain's JSON (save/load) and GPT-2's encoder.json + vocab.bpe.
//
// memtrain's format, one merge per line so diffs stay readable:
//   {"format": "memtrain-bpe", "version": 1, "vocab_size": V, "eot_token": E,
//    "special_token": "<|endoftext|>", "byte_ids": [256 ids], "merges": [[left, right, result], ...]}
// Token bytes are not stored: they follow from byte_ids and the merges (and may not be valid UTF-8,
// which JSON strings cannot hold).
#include "memtrain/data/bpe_tokenizer.h"

#include "data/bpe_pretokenize.h"
#include "data/text_file.h"
#include "io/atomic_file.h"
#include "io/json_limits.h"
#include "memtrain/core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <cstdint>

namespace memtrain::data {

namespace {

constexpr const char* kSave = "BpeTokenizer::save";
constexpr const char* kLoad = "BpeTokenizer::load";
constexpr const char* kGpt2 = "BpeTokenizer::from_gpt2_files";
constexpr const char* kFormat = "memtrain-bpe";
constexpr int kVersion = 1;

nlohmann::json parse_json(const std::string& text, const std::string& path, const char* where) {
  try {
    return nlohmann::json::parse(text, ::memtrain::detail::json_depth_limit(where, path));
  } catch (const nlohmann::json::parse_error& e) {
    ::memtrain::detail::throw_error(where, fmt::format("'{}': not valid JSON near byte {}: {}", path,
                                           e.byte > 0 ? e.byte - 1 : 0, e.what()));
  }
}

std::int64_t get_int(const nlohmann::json& j, const std::string& path, const std::string& field) {
  MT_CHECK(j.is_number_integer(), kLoad, "'{}': {} is a JSON {}, expected an integer", path, field, j.type_name());
  return j.get<std::int64_t>();
}

std::int32_t get_id(const nlohmann::json& j, const std::string& path, const std::string& field) {
  const std::int64_t v = get_int(j, path, field);
  MT_CHECK(v >= 0 && v <= INT32_MAX, kLoad, "'{}': {} is {}, not a token id", path, field, v);
  return static_cast<std::int32_t>(v);
}

const nlohmann::json& get_field(const nlohmann::json& j, const std::string& path, const char* field) {
  auto it = j.find(field);
  MT_CHECK(it != j.end(), kLoad, "'{}': field \"{}\" is missing", path, field);
  return *it;
}

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the other 68 bytes map to U+0100.. in
// byte order, so every token is a printable string (a space is "Ġ", U+0120).
std::array<std::uint32_t, 256> gpt2_byte_to_unicode() {
  std::array<std::uint32_t, 256> cs{};
  std::uint32_t extra = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cs[b] = printable ? b : 256 + extra++;
  }
  return cs;
}

// Bytes of a token written in GPT-2's alphabet; throws naming `what` when a character is not in it.
std::string gpt2_token_bytes(const std::string& token, const std::array<int, 324>& unicode_to_byte,
                             const std::string& what) {
  std::string bytes;
  for (std::size_t pos = 0; pos < token.size();) {
    const detail::Utf8Char c = detail::decode_utf8(token, pos);
    MT_CHECK(c.cp < unicode_to_byte.size() && unicode_to_byte[c.cp] >= 0, kGpt2,
             "{}: token \"{}\" has a character (U+{:04X} at byte {}) outside GPT-2's byte alphabet", what, token,
             c.cp, pos);
    bytes.push_back(static_cast<char>(unicode_to_byte[c.cp]));
    pos += c.len;
  }
  MT_CHECK(!bytes.empty(), kGpt2, "{}: empty token", what);
  return bytes;
}

}  // namespace

void BpeTokenizer::save(const std::string& path) const {
  std::string out = fmt::format(
      "{{\n\"format\": \"{}\",\n\"version\": {},\n\"vocab_size\": {},\n\"eot_token\": {},\n"
      "\"special_token\": \"{}\",\n\"byte_ids\": [{}],\n\"merges\": [",
      kFormat, kVersion, vocab_size(), eot_, kEndOfText, fmt::join(byte_ids_, ", "));
  for (std::size_t i = 0; i < merges_.size(); ++i)
    out += fmt::format("{}\n[{}, {}, {}]", i == 0 ? "" : ",", merges_[i].left, merges_[i].right, merges_[i].result);
  out += "\n]\n}\n";
  ::memtrain::detail::AtomicFileWriter file(path, kSave);
  file.write(out.data(), out.size());
  file.commit();
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  const nlohmann::json j = parse_json(detail::read_text_file(path, kLoad), path, kLoad);
  MT_CHECK(j.is_object(), kLoad, "'{}': top level is a JSON {}, expected an object", path, j.type_name());
  const auto& format = get_field(j, path, "format");
  MT_CHECK(format.is_string() && format.get<std::string>() == kFormat, kLoad,
           "'{}': \"format\" is {}, expected \"{}\"", path, format.dump(), kFormat);
  const std::int64_t version = get_int(get_field(j, path, "version"), path, "\"version\"");
  MT_CHECK(version == kVersion, kLoad, "'{}': unsupported version {}, expected {}", path, version, kVersion);
  const auto& special = get_field(j, path, "special_token");
  MT_CHECK(special.is_string() && special.get<std::string>() == kEndOfText, kLoad,
           "'{}': \"special_token\" is {}, expected \"{}\"", path, special.dump(), kEndOfText);
  const std::int64_t vocab = get_int(get_field(j, path, "vocab_size"), path, "\"vocab_size\"");
  const std::int32_t eot = get_id(get_field(j, path, "eot_token"), path, "\"eot_token\"");

  const auto& jbytes = get_field(j, path, "byte_ids");
  MT_CHECK(jbytes.is_array() && jbytes.size() == 256, kLoad, "'{}': \"byte_ids\" must be an array of 256 ids",
           path);
  std::array<std::int32_t, 256> byte_ids{};
  for (std::size_t b = 0; b < 256; ++b) byte_ids[b] = get_id(jbytes[b], path, fmt::format("byte_ids[{}]", b));

  const auto& jmerges = get_field(j, path, "merges");
  MT_CHECK(jmerges.is_array(), kLoad, "'{}': \"merges\" is a JSON {}, expected an array", path,
           jmerges.type_name());
  std::vector<Merge> merges;
  merges.reserve(jmerges.size());
  for (std::size_t i = 0; i < jmerges.size(); ++i) {
    const auto& m = jmerges[i];
    MT_CHECK(m.is_array() && m.size() == 3, kLoad, "'{}': merges[{}] is {}, expected [left, right, result]", path,
             i, m.dump());
    merges.push_back({get_id(m[0], path, fmt::format("merges[{}][0]", i)),
                      get_id(m[1], path, fmt::format("merges[{}][1]", i)),
                      get_id(m[2], path, fmt::format("merges[{}][2]", i))});
  }
  return BpeTokenizer(byte_ids, std::move(merges), eot, vocab, fmt::format("{}: '{}'", kLoad, path));
}

BpeTokenizer BpeTokenizer::from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
  const auto byte_to_unicode = gpt2_byte_to_unicode();
  std::array<int, 324> unicode_to_byte;
  unicode_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) unicode_to_byte[byte_to_unicode[static_cast<std::size_t>(b)]] = b;

  // encoder.json: token (in the alphabet) -> id; read into bytes -> id.
  const nlohmann::json enc = parse_json(detail::read_text_file(encoder_json, kGpt2), encoder_json, kGpt2);
  MT_CHECK(enc.is_object(), kGpt2, "'{}': top level is a JSON {}, expected an object of token -> id",
           encoder_json, enc.type_name());
  std::unordered_map<std::string, std::int32_t> ids;
  std::int32_t eot = -1;
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    const auto& v = it.value();
    MT_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() <= INT32_MAX, kGpt2,
             "'{}': token \"{}\" has id {}, expected a non-negative integer", encoder_json, it.key(), v.dump());
    const auto id = static_cast<std::int32_t>(v.get<std::int64_t>());
    if (it.key() == kEndOfText) {
      eot = id;
      continue;
    }
    const bool fresh =
        ids.emplace(gpt2_token_bytes(it.key(), unicode_to_byte, fmt::format("'{}'", encoder_json)), id).second;
    MT_CHECK(fresh, kGpt2, "'{}': token \"{}\" appears twice", encoder_json, it.key());
  }
  MT_CHECK(eot >= 0, kGpt2, "'{}': has no \"{}\" token", encoder_json, kEndOfText);
  std::array<std::int32_t, 256> byte_ids{};
  for (std::size_t b = 0; b < 256; ++b) {
    auto it = ids.find(std::string(1, static_cast<char>(b)));
    MT_CHECK(it != ids.end(), kGpt2, "'{}': no token for byte {} (U+{:04X})", encoder_json, b, byte_to_unicode[b]);
    byte_ids[b] = it->second;
  }

  // vocab.bpe: "#version: ..." then "left right" per line, in rank order.
  const std::string text = detail::read_text_file(vocab_bpe, kGpt2);
  std::vector<Merge> merges;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::size_t space = line.find(' ');
    MT_CHECK(space != std::string::npos && space > 0 && line.find(' ', space + 1) == std::string::npos &&
                 space + 1 < line.size(),
             kGpt2, "'{}' line {}: \"{}\" is not two tokens separated by one space", vocab_bpe, line_no, line);
    const std::string what = fmt::format("'{}' line {}", vocab_bpe, line_no);
    const std::string left = gpt2_token_bytes(line.substr(0, space), unicode_to_byte, what);
    const std::string right = gpt2_token_bytes(line.substr(space + 1), unicode_to_byte, what);
    auto lookup = [&](const std::string& bytes, const std::string& shown) {
      auto it = ids.find(bytes);
      MT_CHECK(it != ids.end(), kGpt2, "{}: token \"{}\" is not in '{}'", what, shown, encoder_json);
      return it->second;
    };
    merges.push_back({lookup(left, line.substr(0, space)), lookup(right, line.substr(space + 1)),
                      lookup(left + right, line.substr(0, space) + line.substr(space + 1))});
  }
  return BpeTokenizer(byte_ids, std::move(merges), eot, static_cast<std::int64_t>(enc.size()),
                      fmt::format("{}: '{}' + '{}'", kGpt2, encoder_json, vocab_bpe));
}

}  // namespace memtrain::data
