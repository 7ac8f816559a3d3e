// Byte-level BPE tokenizer and corpus preparation. References: GPT-2's own regex and bpe() (Python, in
// tests/fixtures/tokenizer/ from scripts/make_tokenizer_fixtures.py), a plain brute-force BPE trainer
// written below, and merges and ids worked out by hand.
#include "data/bpe_pretokenize.h"
#include "temp_dir.h"
#include "memtrain/core/error.h"
#include "memtrain/data/bpe_tokenizer.h"
#include "memtrain/data/prepare_corpus.h"
#include "memtrain/data/token_shard.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace memtrain;
using data::BpeTokenizer;

namespace {

const std::string kFixtures = std::string(MEMTRAIN_FIXTURES_DIR) + "/tokenizer";
const std::string kFortunes = "/usr/share/games/fortunes";

using memtrain::test_support::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs fn, which must throw memtrain::Error with every one of `parts` in its message.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no memtrain::Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

// Lowercase words of length 1..6 from a small alphabet, joined by single spaces: plenty of repeated pairs
// and ties, and a pre-tokenisation simple enough to do by hand (first word bare, the rest " word").
std::string random_words(std::mt19937& rng, std::size_t bytes, const std::string& alphabet = "abcdef") {
  std::uniform_int_distribution<int> len(1, 6), letter(0, static_cast<int>(alphabet.size()) - 1);
  std::string text;
  while (text.size() < bytes) {
    if (!text.empty()) text += ' ';
    for (int i = len(rng); i > 0; --i) text += alphabet[static_cast<std::size_t>(letter(rng))];
  }
  return text;
}

// Random words mixed with pieces of several scripts, digits, punctuation and whitespace: enough distinct
// words that training to a few hundred tokens never runs out of pairs.
std::string mixed_text(std::mt19937& rng, std::size_t bytes) {
  const std::vector<std::string> pieces = {"the", " cat", " sat", "'s", " on", " mat", ".", "\n", "  ", " 42",
                                           " café", " naïve", " 日本", " 😀", "!!", " über", "\t", " x1", "--"};
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  std::bernoulli_distribution coin(0.5);
  std::string text;
  while (text.size() < bytes) text += coin(rng) ? pieces[pick(rng)] : " " + random_words(rng, 1, "abcdefghij");
  return text;
}

// Brute-force BPE: every merge recounts all adjacent pairs of every word occurrence, takes the largest
// count, ties to the smallest (left, right), and merges it left to right in every word.
std::vector<BpeTokenizer::Merge> reference_merges(const std::string& corpus, int n_merges) {
  std::vector<std::vector<int>> words;
  std::string word;
  for (std::size_t i = 0; i <= corpus.size(); ++i) {
    if (i == corpus.size() || (corpus[i] == ' ' && !word.empty())) {
      words.emplace_back(word.begin(), word.end());
      word = std::string(1, ' ');
    } else {
      word += corpus[i];
    }
  }
  std::vector<BpeTokenizer::Merge> merges;
  for (int m = 0; m < n_merges; ++m) {
    std::map<std::pair<int, int>, long> counts;
    for (const auto& w : words)
      for (std::size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;  // strictly greater: the first (smallest) pair wins ties
    const int id = 256 + m;
    merges.push_back({best->first.first, best->first.second, id});
    for (auto& w : words) {
      std::vector<int> merged;
      for (std::size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == best->first.first && w[i + 1] == best->first.second) {
          merged.push_back(id);
          i += 2;
        } else {
          merged.push_back(w[i++]);
        }
      }
      w = merged;
    }
  }
  return merges;
}

std::string join_documents(const std::vector<std::string>& docs) {
  std::string all;
  for (const auto& d : docs) (all += d) += data::kEndOfText;
  return all;
}

}  // namespace

// ---- pre-tokenisation ------------------------------------------------------------------------------

TEST(TokenizerPretokenize, MatchesGpt2RegexOnSamples) {
  const auto cases = nlohmann::json::parse(read_file(kFixtures + "/pretokenize.json"));
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    std::vector<std::string> got;
    for (auto w : data::detail::split_words(text)) got.emplace_back(w);
    EXPECT_EQ(got, c["words"].get<std::vector<std::string>>()) << "text: " << text;
  }
}

TEST(TokenizerPretokenize, InvalidUtf8BytesAreOtherCharacters) {
  // 0xFF never appears in UTF-8; a truncated 3-byte sequence is invalid too. Both split like punctuation.
  const std::string text = "ab\xFF\xFE cd \xE6\x97 x";
  std::vector<std::string> got;
  for (auto w : data::detail::split_words(text)) got.emplace_back(w);
  EXPECT_EQ(got, (std::vector<std::string>{"ab", "\xFF\xFE", " cd", " \xE6\x97", " x"}));
}

// ---- training -----------------------------------------------------------------------------------------

// The textbook example: "aaabdaaabac". Pairs: aa 4, ab 2, others 1 -> merge (a,a) = 256. Then
// [aa a b d aa a b a c]: (aa,a) 2 and (a,b) 2 tie -> the smaller pair (97,98) = 257. Then (256,257) 2 = 258.
TEST(TokenizerTrain, HandWorkedMerges) {
  const BpeTokenizer tok = BpeTokenizer::train("aaabdaaabac", 256 + 3 + 1);
  ASSERT_EQ(tok.merges().size(), 3u);
  const std::vector<std::array<int, 3>> want = {{97, 97, 256}, {97, 98, 257}, {256, 257, 258}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tok.merges()[i].left, want[i][0]) << i;
    EXPECT_EQ(tok.merges()[i].right, want[i][1]) << i;
    EXPECT_EQ(tok.merges()[i].result, want[i][2]) << i;
  }
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.eot_token(), 259);
  EXPECT_EQ(tok.token_bytes(258), "aaab");
  EXPECT_EQ(tok.encode("aaabdaaabac"), (std::vector<std::int32_t>{258, 'd', 258, 'a', 'c'}));
}

TEST(TokenizerTrain, MatchesBruteForceReference) {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    const std::string corpus = random_words(rng, 4000);
    constexpr int kMerges = 120;
    const auto want = reference_merges(corpus, kMerges);
    ASSERT_EQ(want.size(), static_cast<std::size_t>(kMerges));
    const BpeTokenizer tok = BpeTokenizer::train(corpus, 256 + kMerges + 1);
    ASSERT_EQ(tok.merges().size(), want.size());
    for (int i = 0; i < kMerges; ++i) {
      const auto& g = tok.merges()[static_cast<std::size_t>(i)];
      const auto& w = want[static_cast<std::size_t>(i)];
      ASSERT_TRUE(g.left == w.left && g.right == w.right && g.result == w.result)
          << "seed " << seed << " merge " << i << ": got (" << g.left << ", " << g.right << ") -> " << g.result
          << ", reference (" << w.left << ", " << w.right << ") -> " << w.result;
    }
  }
}

TEST(TokenizerTrain, SkipsEndOfTextAndIsDeterministic) {
  std::mt19937 rng(7);
  const std::string corpus = mixed_text(rng, 6000) + "<|endoftext|>" + mixed_text(rng, 6000);
  const BpeTokenizer a = BpeTokenizer::train(corpus, 400), b = BpeTokenizer::train(corpus, 400);
  ASSERT_EQ(a.merges().size(), b.merges().size());
  for (std::size_t i = 0; i < a.merges().size(); ++i) {
    EXPECT_EQ(a.merges()[i].left, b.merges()[i].left);
    EXPECT_EQ(a.merges()[i].right, b.merges()[i].right);
  }
  for (std::int32_t id = 0; id < a.vocab_size(); ++id) {
    if (id != a.eot_token()) EXPECT_EQ(a.token_bytes(id).find("<|"), std::string::npos) << id;
  }
}

// ---- round trips ----------------------------------------------------------------------------------

TEST(TokenizerRoundTrip, RandomBytes) {
  std::mt19937 rng(11);
  const BpeTokenizer tok = BpeTokenizer::train(mixed_text(rng, 20000), 512);
  std::uniform_int_distribution<int> byte(0, 255), len(0, 300);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(static_cast<std::size_t>(len(rng)), '\0');
    for (auto& c : s) c = static_cast<char>(byte(rng));
    ASSERT_EQ(tok.decode(tok.encode(s)), s) << "trial " << trial;
  }
  // Long single words exercise the heap merge; special-token text and near misses of it.
  for (const std::string& s :
       {std::string(5000, 'a'), std::string(3000, ' ') + "x", std::string("a<|endoftext|>b<|endoftext|><|endoftext"),
        std::string("<|endoftext|>"), std::string(""), std::string("\0\0\xff", 3)}) {
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  const auto ids = tok.encode("x<|endoftext|>y");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], tok.eot_token());
}

TEST(TokenizerRoundTrip, Utf8Text) {
  const std::string text =
      "Café naïve — Ünïcödé résumé. 日本語のテキスト、テスト。 Привет мир! 😀👍🏽 x😀y\n\t  it's 'll 'RE ½ ²\r\n";
  std::mt19937 rng(12);
  std::string corpus = mixed_text(rng, 10000);
  for (int i = 0; i < 20; ++i) corpus += text;
  const BpeTokenizer tok = BpeTokenizer::train(corpus, 600);
  const auto ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size() * 2, text.size()) << "a tokenizer trained on the text should compress it";
  // Merges never cross a word boundary, so there are at least as many ids as words.
  EXPECT_GE(ids.size(), data::detail::split_words(text).size());
}

TEST(TokenizerRoundTrip, FortunesCorpus) {
  if (!fs::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " not installed (Debian package fortunes)";
  const auto docs = data::read_fortunes(kFortunes);
  EXPECT_GT(docs.size(), 1000u);
  const std::string all = join_documents(docs);
  const BpeTokenizer tok = BpeTokenizer::train(std::string_view(all).substr(0, 300000), 1024);
  const auto ids = tok.encode(all);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_LT(ids.size() * 2, all.size());
}

// ---- GPT-2 files ----------------------------------------------------------------------------------

// The tiny files hold GPT-2's byte order (so '!' = 0, 't' = 83, 'h' = 71, 'e' = 68, 'i' = 72, 's' = 82,
// '\n' = 198, ' ' = 220, as in the real GPT-2), then merges "Ġ t" = 256, "h e" = 257, "Ġt he" = 258,
// "i s" = 259, "Ġt h" = 260, and "<|endoftext|>" = 261.
TEST(TokenizerGpt2Files, TinyFilesEncodeByHand) {
  const BpeTokenizer tok =
      BpeTokenizer::from_gpt2_files(kFixtures + "/tiny_encoder.json", kFixtures + "/tiny_vocab.bpe");
  EXPECT_EQ(tok.vocab_size(), 262);
  EXPECT_EQ(tok.eot_token(), 261);
  EXPECT_EQ(tok.byte_ids()['!'], 0);
  EXPECT_EQ(tok.byte_ids()[' '], 220);
  // "the" -> t + (h e) ; " the" -> (Ġt he) ; " this" -> Ġt first (rank 0), then "i s" (3) before "Ġt h" (4).
  const std::string text = "the the this<|endoftext|>!\n";
  const std::vector<std::int32_t> by_hand = {83, 257, 258, 260, 259, 261, 0, 198};
  EXPECT_EQ(tok.encode(text), by_hand);
  EXPECT_EQ(tok.decode(by_hand), text);
  EXPECT_EQ(tok.token_bytes(258), " the");

  // Every text of the fixture as GPT-2's own bpe() encodes it.
  const auto expected = nlohmann::json::parse(read_file(kFixtures + "/tiny_expected.json"));
  ASSERT_GE(expected.size(), 3u);
  for (const auto& e : expected) {
    const std::string t = e["text"].get<std::string>();
    EXPECT_EQ(tok.encode(t), e["ids"].get<std::vector<std::int32_t>>()) << t;
    EXPECT_EQ(tok.decode(tok.encode(t)), t);
  }
}

TEST(TokenizerGpt2Files, BadFilesNameTheFileAndLine) {
  TempDir dir;
  const std::string enc = kFixtures + "/tiny_encoder.json";
  write_file(dir.file("bad.bpe"), "#version: 0.2\nh e\nx yz\n");  // "xyz" is not in the encoder
  expect_error([&] { BpeTokenizer::from_gpt2_files(enc, dir.file("bad.bpe")); }, {"bad.bpe", "line 3", "\"yz\""});
  write_file(dir.file("one.bpe"), "#version: 0.2\nhe\n");
  expect_error([&] { BpeTokenizer::from_gpt2_files(enc, dir.file("one.bpe")); }, {"one.bpe", "line 2"});
  expect_error([&] { BpeTokenizer::from_gpt2_files(dir.file("missing.json"), kFixtures + "/tiny_vocab.bpe"); },
               {"from_gpt2_files", "missing.json", "cannot open"});
  // Fewer merges than the encoder's ids: id 260 would be neither a byte nor a merge.
  write_file(dir.file("short.bpe"), "#version: 0.2\nĠ t\nh e\nĠt he\ni s\n");
  expect_error([&] { BpeTokenizer::from_gpt2_files(enc, dir.file("short.bpe")); }, {"vocab size 262", "4 merges"});
}

// ---- save / load and errors -----------------------------------------------------------------------

TEST(TokenizerSaveLoad, RoundTrip) {
  TempDir dir;
  std::mt19937 rng(5);
  const std::string corpus = mixed_text(rng, 8000);
  const BpeTokenizer tok = BpeTokenizer::train(corpus, 420);
  tok.save(dir.file("tok.json"));
  const BpeTokenizer back = BpeTokenizer::load(dir.file("tok.json"));
  EXPECT_EQ(back.vocab_size(), tok.vocab_size());
  EXPECT_EQ(back.eot_token(), tok.eot_token());
  EXPECT_EQ(back.encode(corpus), tok.encode(corpus));
  for (std::int32_t id = 0; id < tok.vocab_size(); ++id) ASSERT_EQ(back.token_bytes(id), tok.token_bytes(id));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1) << "temp file left";

  // A GPT-2 tokenizer (byte ids not the identity) survives save/load too.
  const BpeTokenizer gpt2 =
      BpeTokenizer::from_gpt2_files(kFixtures + "/tiny_encoder.json", kFixtures + "/tiny_vocab.bpe");
  gpt2.save(dir.file("gpt2.json"));
  const BpeTokenizer gpt2_back = BpeTokenizer::load(dir.file("gpt2.json"));
  EXPECT_EQ(gpt2_back.encode("the the this<|endoftext|>!\n"), gpt2.encode("the the this<|endoftext|>!\n"));
}

TEST(TokenizerErrors, ClearMessages) {
  TempDir dir;
  expect_error([&] { BpeTokenizer::load(dir.file("nope.json")); }, {"BpeTokenizer::load", "nope.json", "cannot open"});
  write_file(dir.file("corrupt.json"), "{\"format\": \"memtrain-bpe\", \"merges\": [[1, 2");
  expect_error([&] { BpeTokenizer::load(dir.file("corrupt.json")); }, {"corrupt.json", "not valid JSON"});

  const BpeTokenizer tok = BpeTokenizer::train("aaabdaaabac", 260);
  tok.save(dir.file("good.json"));
  std::string text = read_file(dir.file("good.json"));
  // Point the last merge at an id beyond the vocabulary.
  text.replace(text.find("[256, 257, 258]"), 15, "[256, 257, 999]");
  write_file(dir.file("bad_merge.json"), text);
  expect_error([&] { BpeTokenizer::load(dir.file("bad_merge.json")); }, {"bad_merge.json", "merge 2", "999"});
  write_file(dir.file("wrong.json"), "{\"format\": \"other\"}");
  expect_error([&] { BpeTokenizer::load(dir.file("wrong.json")); }, {"wrong.json", "format"});

  expect_error([&] { tok.decode({97, 5000}); }, {"BpeTokenizer::decode", "5000", "index 1", "260"});
  expect_error([&] { tok.decode({-1}); }, {"BpeTokenizer::decode", "-1", "index 0"});
  expect_error([&] { BpeTokenizer::train("hello", 256); }, {"BpeTokenizer::train", "256", "257"});
  expect_error([&] { BpeTokenizer::train("ab ab", 300); }, {"BpeTokenizer::train", "at most vocab_size 259"});
  expect_error([&] { data::prepare_corpus({"a", "b"}, dir.file("out"), {.vocab_size = 70000}); },
               {"prepare_corpus", "70000", "65536"});
  expect_error([&] { data::prepare_corpus({"a", "b"}, dir.file("out"), {.vocab_size = 256}); },
               {"prepare_corpus", "256"});
  expect_error([&] { data::prepare_corpus({"only one"}, dir.file("out"), {}); }, {"prepare_corpus", "1 documents"});
}

// ---- corpus preparation ---------------------------------------------------------------------------

TEST(PrepareCorpus, WritesShardsAndReusesThem) {
  TempDir dir;
  std::mt19937 rng(3);
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back(mixed_text(rng, 200 + 10 * static_cast<std::size_t>(i)));
  const std::string out = dir.file("corpus");
  const data::PrepareOptions opts{.vocab_size = 320, .val_fraction = 0.2, .seed = 9};
  const auto prepared = data::prepare_corpus(docs, out, opts);
  EXPECT_FALSE(prepared.reused);
  EXPECT_EQ(prepared.documents, 40);
  ASSERT_EQ(prepared.train_shards.size(), 1u);
  ASSERT_EQ(prepared.val_shards.size(), 1u);

  const BpeTokenizer tok = BpeTokenizer::load(prepared.tokenizer_path);
  EXPECT_EQ(tok.vocab_size(), 320);
  data::TokenShard train(prepared.train_shards[0]), val(prepared.val_shards[0]);
  train.check_vocab(320);
  val.check_vocab(320);
  EXPECT_EQ(static_cast<std::int64_t>(train.size()), prepared.train_tokens);
  EXPECT_EQ(static_cast<std::int64_t>(val.size()), prepared.val_tokens);
  EXPECT_GT(prepared.val_documents, 0);
  EXPECT_LT(prepared.val_documents, 40);

  // Every token accounted for: each document's ids plus one eot, and the shards decode to the documents.
  std::int64_t total = 0;
  for (const auto& d : docs) total += static_cast<std::int64_t>(tok.encode(d).size()) + 1;
  EXPECT_EQ(prepared.train_tokens + prepared.val_tokens, total);
  auto decode_shard = [&](const data::TokenShard& s) {
    return tok.decode(std::vector<std::int32_t>(s.tokens(), s.tokens() + s.size()));
  };
  const std::string train_text = decode_shard(train), val_text = decode_shard(val);
  EXPECT_EQ(train_text.size() + val_text.size(), join_documents(docs).size());
  std::size_t eots = 0;
  for (std::size_t p = val_text.find(data::kEndOfText); p != std::string::npos;
       p = val_text.find(data::kEndOfText, p + 1))
    ++eots;
  EXPECT_EQ(static_cast<std::int64_t>(eots), prepared.val_documents);

  // Second call: reused, nothing rewritten.
  const auto mtime = fs::last_write_time(prepared.train_shards[0]);
  const auto again = data::prepare_corpus(docs, out, opts);
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.train_tokens, prepared.train_tokens);
  EXPECT_EQ(again.val_tokens, prepared.val_tokens);
  EXPECT_EQ(fs::last_write_time(prepared.train_shards[0]), mtime);

  // Another seed re-splits (same tokenizer, loaded), and other documents re-encode.
  auto other = opts;
  other.seed = 10;
  const auto resplit = data::prepare_corpus(docs, out, other);
  EXPECT_FALSE(resplit.reused);
  EXPECT_EQ(resplit.train_tokens + resplit.val_tokens, total);
  docs.pop_back();
  EXPECT_FALSE(data::prepare_corpus(docs, out, other).reused);
  // A damaged shard is noticed and rewritten.
  write_file(prepared.val_shards[0], "junk");
  const auto repaired = data::prepare_corpus(docs, out, other);
  EXPECT_FALSE(repaired.reused);
  EXPECT_EQ(data::TokenShard(prepared.val_shards[0]).size(), static_cast<std::size_t>(repaired.val_tokens));
}

TEST(PrepareCorpus, AtLeastOneDocumentPerSplit) {
  TempDir dir;
  const std::vector<std::string> docs = {"one fish", "two fish", "red fish", "blue fish"};
  const auto none = data::prepare_corpus(docs, dir.file("a"), {.vocab_size = 257, .val_fraction = 0.0});
  EXPECT_EQ(none.val_documents, 1);
  const auto all = data::prepare_corpus(docs, dir.file("b"), {.vocab_size = 257, .val_fraction = 1.0});
  EXPECT_EQ(all.val_documents, 3);
}

TEST(PrepareCorpus, ReadFortunesSkipsIndexesLinksAndSubdirectories) {
  TempDir dir;
  write_file(dir.file("jokes"), "First joke.\n%\nSecond\njoke.\n%\n\n%\nThird %.\n");
  write_file(dir.file("jokes.dat"), std::string("\0\0\0\2binary index", 16));
  fs::create_symlink(dir.file("jokes"), dir.file("jokes.u8"));
  fs::create_directory(dir.file("off"));
  write_file(dir.file("off/rude"), "Not read.\n%\n");
  const auto docs = data::read_fortunes(dir.path());
  EXPECT_EQ(docs, (std::vector<std::string>{"First joke.\n", "Second\njoke.\n", "Third %.\n"}));

  TempDir empty;
  expect_error([&] { data::read_fortunes(empty.path()); }, {"read_fortunes", empty.path(), "no fortunes"});
  expect_error([&] { data::read_fortunes(empty.file("absent")); }, {"read_fortunes", "not a directory"});

  // read_documents: a plain file splits into paragraphs, a "%" file like fortunes.
  write_file(dir.file("off/plain.txt"), "Para one\nline two\n\n  \nPara two\n");
  EXPECT_EQ(data::read_documents(dir.file("off/plain.txt")),
            (std::vector<std::string>{"Para one\nline two\n", "Para two\n"}));
  EXPECT_EQ(data::read_documents(dir.file("jokes")).size(), 3u);
}

TEST(PrepareCorpus, FortunesDirectoryWhenInstalled) {
  if (!fs::is_directory(kFortunes)) GTEST_SKIP() << kFortunes << " not installed (Debian package fortunes)";
  const auto docs = data::read_fortunes(kFortunes);
  std::size_t bytes = 0;
  for (const auto& d : docs) {
    EXPECT_FALSE(d.empty());
    bytes += d.size();
  }
  EXPECT_GT(bytes, 2'000'000u) << "the Debian fortunes package holds about 2.8 MB of text";
}
