// GPT-2's pre-tokenisation, by hand: the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// splits text into words, and BPE merges never cross a word boundary. Character classes work on UTF-8
// code points and approximate Unicode's (see classify_code_point in the .cpp): letters are ASCII letters
// plus every code point >= 0x80 not listed as whitespace, a digit or punctuation/symbol/mark; a byte that
// is not valid UTF-8 counts as one "other" character, so any byte string splits into words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace memtrain::data::detail {

enum class CharClass : std::uint8_t { letter, digit, space, other };

inline constexpr std::uint32_t kInvalidUtf8 = 0xFFFFFFFFu;

struct Utf8Char {
  std::uint32_t cp;  // kInvalidUtf8 for a byte that does not start a valid UTF-8 sequence
  std::size_t len;   // bytes used: 1 for an invalid byte
};

// Decodes the code point at byte `pos` < text.size(); strict (no overlongs, surrogates or > U+10FFFF).
Utf8Char decode_utf8(std::string_view text, std::size_t pos);

// Class of a Unicode code point (the approximation documented above).
CharClass classify_code_point(std::uint32_t cp);

// End (exclusive) of the word that starts at byte `pos` < text.size().
std::size_t next_word_end(std::string_view text, std::size_t pos);

// All words of `text` in order; their concatenation is `text`.
std::vector<std::string_view> split_words(std::string_view text);

// Calls fn(segment, is_eot) for the pieces of `text` between occurrences of "<|endoftext|>" (is_eot false,
// possibly empty segments are skipped) and for each occurrence (is_eot true), in order.
template <typename Fn>
void for_each_eot_segment(std::string_view text, std::string_view eot, Fn&& fn) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t hit = text.find(eot, pos);
    if (hit == std::string_view::npos) hit = text.size();
    if (hit > pos) fn(text.substr(pos, hit - pos), false);
    if (hit == text.size()) break;
    fn(text.substr(hit, eot.size()), true);
    pos = hit + eot.size();
  }
}

}  // namespace memtrain::data::detail
