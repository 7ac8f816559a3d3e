// BPE training. The corpus is reduced once to its unique words with counts; pair counts are kept over
// those words and updated after each merge only for the words that contain the merged pair (found through
// a pair -> words index), so a merge costs time proportional to the words it touches, not to the corpus.
// The next pair comes from a max-heap with lazy deletion: an entry is used only if its count is current.
#include "memtrain/data/bpe_tokenizer.h"

#include "data/bpe_pretokenize.h"
#include "memtrain/core/error.h"

#include <algorithm>
#include <climits>
#include <queue>

namespace memtrain::data {

namespace {

constexpr const char* kTrain = "BpeTokenizer::train";

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

struct Word {
  std::vector<std::int32_t> symbols;
  std::int64_t count = 0;
  std::int64_t last_merge = -1;  // the merge that last visited it, so duplicates in an index list run once
};

struct HeapEntry {
  std::int64_t count;
  std::uint64_t key;
  // Max-heap on count; on equal counts the smaller (left, right) wins, i.e. the smaller key.
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

bool contains_pair(const std::vector<std::int32_t>& s, std::int32_t a, std::int32_t b) {
  for (std::size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] == a && s[i + 1] == b) return true;
  return false;
}

// Left to right, non-overlapping: "a a a" with (a, a) becomes "aa a", as encode() does.
void merge_pair(std::vector<std::int32_t>& s, std::int32_t a, std::int32_t b, std::int32_t result) {
  std::size_t w = 0;
  for (std::size_t r = 0; r < s.size(); ++w) {
    if (r + 1 < s.size() && s[r] == a && s[r + 1] == b) {
      s[w] = result;
      r += 2;
    } else {
      s[w] = s[r++];
    }
  }
  s.resize(w);
}

}  // namespace

BpeTokenizer BpeTokenizer::train(std::string_view corpus, std::int64_t vocab_size) {
  MT_CHECK(vocab_size >= 257 && vocab_size <= INT32_MAX, kTrain,
           "vocab_size {} is outside [257, {}] (256 bytes + \"<|endoftext|>\" at least)", vocab_size, INT32_MAX);
  const std::int64_t want_merges = vocab_size - 257;

  // Unique words with counts; "<|endoftext|>" separates text but is not learned.
  std::unordered_map<std::string_view, std::int64_t> word_counts;
  detail::for_each_eot_segment(corpus, kEndOfText, [&](std::string_view segment, bool is_eot) {
    if (is_eot) return;
    for (std::size_t pos = 0; pos < segment.size();) {
      const std::size_t end = detail::next_word_end(segment, pos);
      ++word_counts[segment.substr(pos, end - pos)];
      pos = end;
    }
  });
  std::vector<Word> words;
  words.reserve(word_counts.size());
  for (const auto& [text, count] : word_counts) {
    if (text.size() < 2) continue;  // no pairs
    Word w;
    w.symbols.assign(text.begin(), text.end());
    for (auto& s : w.symbols) s = static_cast<unsigned char>(s);
    w.count = count;
    words.push_back(std::move(w));
  }

  std::unordered_map<std::uint64_t, std::int64_t> pair_count;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> where;  // may hold stale or repeated words
  for (std::size_t wi = 0; wi < words.size(); ++wi) {
    const auto& s = words[wi].symbols;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const std::uint64_t key = pair_key(s[i], s[i + 1]);
      pair_count[key] += words[wi].count;
      auto& list = where[key];
      if (list.empty() || list.back() != static_cast<std::int32_t>(wi)) list.push_back(static_cast<std::int32_t>(wi));
    }
  }
  std::priority_queue<HeapEntry> heap;
  for (const auto& [key, count] : pair_count) heap.push({count, key});

  std::vector<Merge> merges;
  merges.reserve(static_cast<std::size_t>(want_merges));
  std::unordered_map<std::uint64_t, std::int64_t> delta;
  while (static_cast<std::int64_t>(merges.size()) < want_merges) {
    // Lazy deletion: skip entries whose count is no longer the pair's count.
    while (!heap.empty()) {
      auto it = pair_count.find(heap.top().key);
      if (it != pair_count.end() && it->second == heap.top().count) break;
      heap.pop();
    }
    MT_CHECK(!heap.empty(), kTrain,
             "the corpus ({} bytes, {} distinct words) has no pairs left after {} merges, so it supports at most "
             "vocab_size {}, not {}",
             corpus.size(), word_counts.size(), merges.size(), merges.size() + 257, vocab_size);
    const std::uint64_t key = heap.top().key;
    heap.pop();
    const auto a = static_cast<std::int32_t>(key >> 32), b = static_cast<std::int32_t>(key & 0xFFFFFFFFu);
    const auto result = static_cast<std::int32_t>(256 + merges.size());
    const auto merge_index = static_cast<std::int64_t>(merges.size());
    merges.push_back({a, b, result});

    std::vector<std::int32_t> list = std::move(where[key]);
    where.erase(key);
    delta.clear();
    for (std::int32_t wi : list) {
      Word& w = words[static_cast<std::size_t>(wi)];
      if (w.last_merge == merge_index || !contains_pair(w.symbols, a, b)) continue;
      w.last_merge = merge_index;
      auto& s = w.symbols;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= w.count;
      merge_pair(s, a, b, result);
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const std::uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += w.count;
        // Only pairs with the new token are new to this word; its other pairs' lists already hold it.
        if (s[i] == result || s[i + 1] == result) {
          auto& l = where[k];
          if (l.empty() || l.back() != wi) l.push_back(wi);
        }
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      auto it = pair_count.find(k);
      const std::int64_t now = (it == pair_count.end() ? 0 : it->second) + d;
      if (now > 0) {
        pair_count[k] = now;
        heap.push({now, k});
      } else {
        // A pair of old tokens never reappears (new pairs always hold the new token), so it can go.
        if (it != pair_count.end()) pair_count.erase(it);
        where.erase(k);
      }
    }
  }

  std::array<std::int32_t, 256> byte_ids{};
  for (int i = 0; i < 256; ++i) byte_ids[static_cast<std::size_t>(i)] = i;
  return BpeTokenizer(byte_ids, std::move(merges), static_cast<std::int32_t>(vocab_size - 1), vocab_size, kTrain);
}

}  // namespace memtrain::data
