// GPT-2 pre-tokenisation without a regex engine: UTF-8 decoding, a small table of Unicode classes, and the
// pattern's alternatives tried in the same order the regex tries them.
#include "data/bpe_pretokenize.h"

namespace memtrain::data::detail {

namespace {

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

bool in(std::uint32_t cp, std::uint32_t lo, std::uint32_t hi) { return cp >= lo && cp <= hi; }

CharClass class_at(std::string_view s, std::size_t i, std::size_t* len) {
  const Utf8Char d = decode_utf8(s, i);
  *len = d.len;
  return d.cp == kInvalidUtf8 ? CharClass::other : classify_code_point(d.cp);
}

}  // namespace

Utf8Char decode_utf8(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  const std::size_t left = s.size() - i;
  auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (b0 >= 0xC2 && b0 <= 0xDF && left >= 2 && is_cont(at(1))) return {((b0 & 0x1Fu) << 6) | (at(1) & 0x3Fu), 2};
  if (b0 >= 0xE0 && b0 <= 0xEF && left >= 3 && is_cont(at(1)) && is_cont(at(2))) {
    const std::uint32_t cp = ((b0 & 0x0Fu) << 12) | ((at(1) & 0x3Fu) << 6) | (at(2) & 0x3Fu);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {cp, 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && left >= 4 && is_cont(at(1)) && is_cont(at(2)) && is_cont(at(3))) {
    const std::uint32_t cp =
        ((b0 & 0x07u) << 18) | ((at(1) & 0x3Fu) << 12) | ((at(2) & 0x3Fu) << 6) | (at(3) & 0x3Fu);
    if (cp >= 0x10000 && cp <= 0x10FFFF) return {cp, 4};
  }
  return {kInvalidUtf8, 1};
}

CharClass classify_code_point(std::uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::digit;
    if (cp == ' ' || in(cp, 0x09, 0x0D)) return CharClass::space;
    return CharClass::other;
  }
  // Unicode White_Space (what \s matches in the `regex` module GPT-2 used).
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || in(cp, 0x2000, 0x200A) || cp == 0x2028 || cp == 0x2029 ||
      cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return CharClass::space;
  // \p{N}: Latin-1 superscripts and fractions, Arabic-Indic and Devanagari digits, super/subscripts,
  // number forms, circled numbers, fullwidth digits.
  if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || in(cp, 0xBC, 0xBE) || in(cp, 0x0660, 0x0669) ||
      in(cp, 0x06F0, 0x06F9) || in(cp, 0x0966, 0x096F) || cp == 0x2070 || in(cp, 0x2074, 0x2079) ||
      in(cp, 0x2080, 0x2089) || in(cp, 0x2150, 0x2189) || in(cp, 0x2460, 0x249B) || in(cp, 0xFF10, 0xFF19))
    return CharClass::digit;
  // Neither letter nor digit: C1 controls, Latin-1 punctuation and symbols (but ª µ º are letters),
  // × ÷, combining marks, general punctuation, currency, letterlike symbols, arrows, maths, technical,
  // box drawing, shapes, dingbats, supplemental punctuation, CJK punctuation, variation selectors,
  // halfwidth/fullwidth punctuation, specials, private use, emoji and other pictographs, tags.
  if (in(cp, 0x80, 0xBF)) return (cp == 0xAA || cp == 0xB5 || cp == 0xBA) ? CharClass::letter : CharClass::other;
  if (cp == 0xD7 || cp == 0xF7 || in(cp, 0x0300, 0x036F) || in(cp, 0x1AB0, 0x1AFF) || in(cp, 0x1DC0, 0x1DFF) ||
      in(cp, 0x2000, 0x2BFF) || in(cp, 0x2E00, 0x2E7F) || in(cp, 0x3000, 0x303F) || in(cp, 0xE000, 0xF8FF) ||
      in(cp, 0xFE00, 0xFE6F) || in(cp, 0xFF01, 0xFF0F) || in(cp, 0xFF1A, 0xFF20) || in(cp, 0xFF3B, 0xFF40) ||
      in(cp, 0xFF5B, 0xFF65) || in(cp, 0xFFF0, 0xFFFF) || in(cp, 0x1F000, 0x1FAFF) || in(cp, 0xE0000, 0xE007F) ||
      cp >= 0xF0000)
    return CharClass::other;
  return CharClass::letter;
}

std::size_t next_word_end(std::string_view s, std::size_t i) {
  const std::size_t n = s.size();
  // 's 't 'm 'd 're 've 'll (lower case only, as in GPT-2).
  if (s[i] == '\'' && i + 1 < n) {
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (i + 2 < n) {
      const char c2 = s[i + 2];
      if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) return i + 3;
    }
  }
  // ' ?letters', ' ?digits', ' ?other': an optional ASCII space, then a run of one class.
  std::size_t j = i + (s[i] == ' ' ? 1 : 0);
  if (j < n) {
    std::size_t len = 0;
    const CharClass cls = class_at(s, j, &len);
    if (cls != CharClass::space) {
      std::size_t end = j + len;
      while (end < n && class_at(s, end, &len) == cls) end += len;
      return end;
    }
  }
  // Whitespace at i: \s+(?!\S) takes the run but leaves its last character to the next word (which then
  // matches ' ?X' if it is a space); a single character, or a run reaching the end, is taken whole.
  std::size_t end = i, last = i, count = 0, len = 0;
  while (end < n && class_at(s, end, &len) == CharClass::space) {
    last = end;
    end += len;
    ++count;
  }
  if (end == n || count <= 1) return end;
  return last;
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = next_word_end(text, pos);
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return words;
}

}  // namespace memtrain::data::detail
