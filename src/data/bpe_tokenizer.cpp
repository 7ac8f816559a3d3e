// BpeTokenizer core: validating constructor, encode (merges applied by rank, words memoised) and decode.
#include "memtrain/data/bpe_tokenizer.h"

#include "data/bpe_pretokenize.h"
#include "memtrain/core/error.h"

#include <climits>
#include <functional>
#include <mutex>
#include <queue>

namespace memtrain::data {

namespace detail {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Word -> ids. Bounded: cleared when full, so a long stream of distinct words cannot grow it without end.
struct BpeWordCache {
  static constexpr std::size_t kMaxEntries = 1 << 18;
  static constexpr std::size_t kMaxWordBytes = 256;  // longer words are rare; caching them only costs memory
  std::mutex mu;
  std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> map;
};

}  // namespace detail

namespace {

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

}  // namespace

BpeTokenizer::BpeTokenizer(const std::array<std::int32_t, 256>& byte_ids, std::vector<Merge> merges,
                           std::int32_t eot, std::int64_t vocab_size, const std::string& where)
    : byte_ids_(byte_ids), merges_(std::move(merges)), eot_(eot), cache_(std::make_shared<detail::BpeWordCache>()) {
  MT_CHECK(vocab_size >= 257 && vocab_size <= INT32_MAX, where,
           "vocab size {} is outside [257, {}] (256 bytes + \"<|endoftext|>\" at least)", vocab_size, INT32_MAX);
  const auto want = static_cast<std::int64_t>(merges_.size()) + 257;
  MT_CHECK(want == vocab_size, where, "vocab size {} does not match 256 bytes + {} merges + 1 special token = {}",
           vocab_size, merges_.size(), want);
  tokens_.assign(static_cast<std::size_t>(vocab_size), std::string());
  std::vector<char> defined(static_cast<std::size_t>(vocab_size), 0);
  auto in_range = [&](std::int32_t id) { return id >= 0 && id < vocab_size; };
  for (int b = 0; b < 256; ++b) {
    const std::int32_t id = byte_ids_[static_cast<std::size_t>(b)];
    MT_CHECK(in_range(id), where, "byte {} has id {}, outside [0, {})", b, id, vocab_size);
    MT_CHECK(!defined[static_cast<std::size_t>(id)], where, "byte {} has id {}, already given to another byte", b,
             id);
    defined[static_cast<std::size_t>(id)] = 1;
    tokens_[static_cast<std::size_t>(id)] = std::string(1, static_cast<char>(b));
  }
  MT_CHECK(in_range(eot_) && !defined[static_cast<std::size_t>(eot_)], where,
           "\"<|endoftext|>\" id {} is outside [0, {}) or already a byte's id", eot_, vocab_size);
  merge_rank_.reserve(merges_.size());
  for (std::size_t r = 0; r < merges_.size(); ++r) {
    const Merge& m = merges_[r];
    // Operands defined before the merge is what makes "lowest rank first" well defined in encode.
    MT_CHECK(in_range(m.left) && in_range(m.right) && defined[static_cast<std::size_t>(m.left)] &&
                 defined[static_cast<std::size_t>(m.right)],
             where, "merge {} ({} {} -> {}) uses an id that is not a byte or an earlier merge's result", r, m.left,
             m.right, m.result);
    MT_CHECK(in_range(m.result) && m.result != eot_ && !defined[static_cast<std::size_t>(m.result)], where,
             "merge {} ({} {} -> {}): result id is outside [0, {}), the eot id or already defined", r, m.left,
             m.right, m.result, vocab_size);
    const bool fresh = merge_rank_.emplace(pair_key(m.left, m.right), static_cast<std::int32_t>(r)).second;
    MT_CHECK(fresh, where, "merge {} ({} {}) repeats an earlier merge of the same pair", r, m.left, m.right);
    defined[static_cast<std::size_t>(m.result)] = 1;
    tokens_[static_cast<std::size_t>(m.result)] =
        tokens_[static_cast<std::size_t>(m.left)] + tokens_[static_cast<std::size_t>(m.right)];
  }
  tokens_[static_cast<std::size_t>(eot_)] = std::string(kEndOfText);
}

const std::string& BpeTokenizer::token_bytes(std::int32_t id) const {
  MT_CHECK(id >= 0 && id < vocab_size(), "BpeTokenizer::token_bytes", "token id {} is outside the vocabulary of {}",
           id, vocab_size());
  return tokens_[static_cast<std::size_t>(id)];
}

// GPT-2's bpe(): repeatedly merge the lowest-ranked adjacent pair. A min-heap of (rank, position) over a
// linked list of symbols makes it O(n log n) per word instead of O(n^2), which matters for long runs
// (ASCII art, random bytes). Popping equal ranks by position merges overlapping pairs left to right, as
// GPT-2 does; new pairs always rank later than the merge that made them (checked in the constructor).
void BpeTokenizer::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= detail::BpeWordCache::kMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->map.find(word);
    if (it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }

  const int n = static_cast<int>(word.size());
  std::vector<std::int32_t> id(static_cast<std::size_t>(n));
  std::vector<int> next(static_cast<std::size_t>(n)), prev(static_cast<std::size_t>(n));
  std::vector<char> alive(static_cast<std::size_t>(n), 1);
  for (int i = 0; i < n; ++i) {
    id[static_cast<std::size_t>(i)] = byte_ids_[static_cast<unsigned char>(word[static_cast<std::size_t>(i)])];
    next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<std::size_t>(i)] = i - 1;
  }
  struct Candidate {
    std::int32_t rank;
    int pos, right;
    std::int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0) return;
    const int r = next[static_cast<std::size_t>(pos)];
    if (r < 0) return;
    const std::int32_t a = id[static_cast<std::size_t>(pos)], b = id[static_cast<std::size_t>(r)];
    auto it = merge_rank_.find(pair_key(a, b));
    if (it != merge_rank_.end()) heap.push({it->second, pos, r, a, b});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto p = static_cast<std::size_t>(c.pos), r = static_cast<std::size_t>(c.right);
    // Stale when either symbol was merged away or changed since the candidate was pushed.
    if (!alive[p] || next[p] != c.right || id[p] != c.left_id || id[r] != c.right_id) continue;
    id[p] = merges_[static_cast<std::size_t>(c.rank)].result;
    alive[r] = 0;
    next[p] = next[r];
    if (next[r] >= 0) prev[static_cast<std::size_t>(next[r])] = c.pos;
    if (prev[p] >= 0) push(prev[p]);
    push(c.pos);
  }
  std::vector<std::int32_t> ids;
  for (int i = 0; i >= 0; i = next[static_cast<std::size_t>(i)]) ids.push_back(id[static_cast<std::size_t>(i)]);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->map.size() >= detail::BpeWordCache::kMaxEntries) cache_->map.clear();
    cache_->map.emplace(std::string(word), std::move(ids));
  }
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 1);
  detail::for_each_eot_segment(text, kEndOfText, [&](std::string_view segment, bool is_eot) {
    if (is_eot) {
      out.push_back(eot_);
      return;
    }
    for (std::size_t pos = 0; pos < segment.size();) {
      const std::size_t end = detail::next_word_end(segment, pos);
      encode_word(segment.substr(pos, end - pos), out);
      pos = end;
    }
  });
  return out;
}

std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "BpeTokenizer::decode",
             "token id {} at index {} is outside the vocabulary [0, {})", ids[i], i, vocab_size());
    bytes += tokens_[static_cast<std::size_t>(ids[i])].size();
  }
  std::string text;
  text.reserve(bytes);
  for (std::int32_t t : ids) text += tokens_[static_cast<std::size_t>(t)];
  return text;
}

}  // namespace memtrain::data
