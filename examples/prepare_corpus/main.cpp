// Turns a text corpus into what train_gpt reads: a byte-level BPE tokenizer (trained on the corpus, or
// GPT-2's own when its encoder.json and vocab.bpe are given) and llm.c train/val token shards.
//
//   memtrain_prepare_corpus --input /usr/share/games/fortunes --out-dir data/fortunes --vocab-size 4096
//   memtrain_prepare_corpus --input book.txt --out-dir data/book --gpt2-vocab DIR   (DIR/encoder.json, DIR/vocab.bpe)
#include <memtrain/memtrain.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <string>

using namespace memtrain;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"Prepare a text corpus for train_gpt: BPE tokenizer + llm.c token shards"};
  std::string input = "/usr/share/games/fortunes", out_dir = "data/fortunes", gpt2_vocab;
  data::PrepareOptions options;
  app.add_option("--input", input, "a text file (paragraphs or %-separated) or a fortunes directory")
      ->capture_default_str();
  app.add_option("--out-dir", out_dir, "tokenizer.json, train_000.bin, val_000.bin go here")->capture_default_str();
  app.add_option("--vocab-size", options.vocab_size, "tokenizer size when training one")->capture_default_str();
  app.add_option("--val-fraction", options.val_fraction, "share of documents held out")->capture_default_str();
  app.add_option("--seed", options.seed, "seed of the train/val split")->capture_default_str();
  app.add_option("--gpt2-vocab", gpt2_vocab, "directory with GPT-2's encoder.json and vocab.bpe: use that tokenizer");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!gpt2_vocab.empty()) {
      // prepare_corpus uses a tokenizer.json it finds in out_dir; GPT-2's is written there first.
      const auto tokenizer = data::BpeTokenizer::from_gpt2_files((fs::path(gpt2_vocab) / "encoder.json").string(),
                                                                 (fs::path(gpt2_vocab) / "vocab.bpe").string());
      fs::create_directories(out_dir);
      tokenizer.save((fs::path(out_dir) / "tokenizer.json").string());
      options.vocab_size = tokenizer.vocab_size();
    }
    const auto documents = data::read_documents(input);
    const auto prepared = data::prepare_corpus(documents, out_dir, options);
    fmt::print("{} documents from {} -> {} ({}): {} train tokens in {}, {} val tokens in {} ({} documents)\n",
               prepared.documents, input, prepared.tokenizer_path, prepared.reused ? "reused" : "written",
               prepared.train_tokens, fmt::join(prepared.train_shards, " "), prepared.val_tokens,
               fmt::join(prepared.val_shards, " "), prepared.val_documents);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prepare_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
