// BpeTokenizer: byte-level BPE as in GPT-2. Text is first split into words with GPT-2's pattern ('s 't 're
// 've 'm 'll 'd, ' ?letters', ' ?digits', ' ?other', whitespace runs); merges apply inside a word only.
// Every byte is a token, so any byte string (invalid UTF-8 included) encodes and decode(encode(s)) == s.
// The special text "<|endoftext|>" is never split: it encodes to eot_token() and decodes back to itself.
// Character classes are decoded from UTF-8 and approximate Unicode's (src/data/bpe_pretokenize.h lists
// them); on the 2.7 MB Debian fortunes corpus the split equals GPT-2's regex word for word.
//
// A tokenizer is immutable after construction. encode() memoises words in a cache shared by copies and
// guarded by a mutex, so concurrent encode() calls on one tokenizer are safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace memtrain::data {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

namespace detail {
struct BpeWordCache;
}  // namespace detail

class BpeTokenizer {
 public:
  // One merge, in rank order: tokens `left` and `right` next to each other in a word become `result`.
  struct Merge {
    std::int32_t left, right, result;
  };

  // Trains on `corpus` until vocab_size tokens: ids 0..255 are the bytes, 256.. the merges in order, and
  // vocab_size - 1 is "<|endoftext|>" (occurrences of it in the corpus are skipped, not learned). Each step
  // merges the most frequent adjacent pair; ties go to the smallest (left, right) ids, so training is
  // deterministic. Throws when vocab_size < 257 or when the corpus runs out of pairs before vocab_size.
  static BpeTokenizer train(std::string_view corpus, std::int64_t vocab_size);
  // GPT-2's released files: encoder.json (token -> id, tokens written in GPT-2's byte-to-unicode alphabet)
  // and vocab.bpe (a "#version" line, then one "left right" merge per line, in rank order).
  static BpeTokenizer from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe);
  // memtrain's JSON format, written by save(); every field is validated, errors name the file and field.
  static BpeTokenizer load(const std::string& path);
  // Writes atomically (temp file + fsync + rename).
  void save(const std::string& path) const;

  // Ids of `text`; each "<|endoftext|>" in it becomes eot_token().
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Bytes of `ids` concatenated; throws naming the first id outside [0, vocab_size) and its index.
  std::string decode(const std::vector<std::int32_t>& ids) const;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int32_t eot_token() const { return eot_; }
  // The bytes of one token ("<|endoftext|>" for eot_token()); throws for an id outside the vocabulary.
  const std::string& token_bytes(std::int32_t id) const;
  const std::vector<Merge>& merges() const { return merges_; }
  // Id of each single byte: the identity for trained tokenizers, GPT-2's own order for its files.
  const std::array<std::int32_t, 256>& byte_ids() const { return byte_ids_; }

  // Builds a tokenizer from its parts after checking them: byte ids distinct and in range, each merge's
  // operands defined before it, results distinct, and every id in [0, vocab_size) a byte, a merge result
  // or eot. `where` names the caller (and file) in error messages.
  BpeTokenizer(const std::array<std::int32_t, 256>& byte_ids, std::vector<Merge> merges, std::int32_t eot,
               std::int64_t vocab_size, const std::string& where);

 private:
  // Applies merges by rank to one pre-tokenised word, appending its ids to `out`.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  std::array<std::int32_t, 256> byte_ids_{};
  std::vector<Merge> merges_;
  std::int32_t eot_ = 0;
  std::vector<std::string> tokens_;  // id -> bytes
  // (left << 32 | right) -> index into merges_, which is the merge's rank.
  std::unordered_map<std::uint64_t, std::int32_t> merge_rank_;
  std::shared_ptr<detail::BpeWordCache> cache_;
};

}  // namespace memtrain::data
