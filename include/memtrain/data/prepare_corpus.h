// Corpus preparation for language-model training: documents in, a BPE tokenizer and llm.c token shards out.
//
//   auto docs = data::read_fortunes();                       // ~15k short documents, ~2.8 MB
//   auto prepared = data::prepare_corpus(docs, "data/fortunes", {.vocab_size = 4096});
//   data::TokenShard train(prepared.train_shards[0]);
//
// Each document is encoded followed by "<|endoftext|>" (a literal "<|endoftext|>" inside a document also
// becomes the eot token), so a training window that spans two documents sees the boundary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::data {

// Documents of the Debian fortunes package: every regular file directly in `dir`, in name order, except
// *.dat (strfile indexes), *.u8 (links to the plain files), hidden files and files holding NUL bytes
// (not text); subdirectories (e.g. the offensive "off/") are not entered. A file is split on lines that
// are exactly "%"; each document keeps its lines with their '\n'; blank documents are dropped. Throws
// memtrain::Error naming `dir` when it is not a directory or yields no document.
std::vector<std::string> read_fortunes(const std::string& dir = "/usr/share/games/fortunes");

// Documents of `path`: a directory is read with read_fortunes. A file with a line that is exactly "%" is
// split like a fortunes file; any other file is split into paragraphs at blank (whitespace-only) lines,
// each paragraph keeping its lines with their '\n'. Throws naming `path` when nothing is left.
std::vector<std::string> read_documents(const std::string& path);

struct PrepareOptions {
  std::int64_t vocab_size = 4096;  // in [257, 65536]: shards store uint16 ids
  double val_fraction = 0.05;      // probability that a document goes to validation, in [0, 1]
  std::uint64_t seed = 1;          // the train/val assignment is a pure function of (seed, document index)
};

struct PreparedCorpus {
  std::string tokenizer_path;  // out_dir/tokenizer.json
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  std::int64_t train_tokens = 0, val_tokens = 0, documents = 0;
  std::int64_t val_documents = 0;
  bool reused = false;  // true when the outputs of an earlier identical call were found and kept
};

// Writes out_dir/tokenizer.json, out_dir/train_000.bin, out_dir/val_000.bin and, last, the stamp
// out_dir/prepared.json (all atomically; out_dir is created). The tokenizer is loaded from
// out_dir/tokenizer.json when that exists with the requested vocab size (so a tokenizer can be supplied;
// one that does not load is an error, not silently replaced), otherwise trained on all documents and
// written there. Each document goes to val with probability val_fraction, with at least one document in
// each split. When the stamp matches the options, the documents (by hash) and the tokenizer file, and both
// shards hold the token counts it records, nothing is re-encoded and the result has reused = true.
// Throws memtrain::Error("prepare_corpus: ...") for fewer than two documents, a vocab size outside
// [257, 65536] or val_fraction outside [0, 1].
PreparedCorpus prepare_corpus(const std::vector<std::string>& documents, const std::string& out_dir,
                              const PrepareOptions& options = {});

}  // namespace memtrain::data
