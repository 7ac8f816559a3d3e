// Datasets and the batch loader.
//
// A Dataset is a finite list of samples that can collate any list of sample indices into one Batch. The
// Loader decides which samples go into which batch: epoch e visits the samples in a permutation drawn from
// Philox(seed, e) (or in order without shuffle), rank r of world_size takes every world_size-th sample
// of that order starting at r, and batch k of an epoch holds the next batch_size of those. So the content
// of every batch is a pure function of (seed, epoch, k, rank, world_size): two loaders with the same
// options yield the same batches, and a position (epoch, k) is all a checkpoint needs to resume exactly.
//
// A background thread collates batches ahead into a bounded queue (prefetch); next() pops them in order.
// position() counts batches handed out by next(), not batches prefetched, and seek() drops the queue and
// restarts the worker there.
#pragma once

#include "memtrain/core/tensor.h"
#include "memtrain/data/token_shard.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memtrain::data {

struct Batch {
  Tensor inputs;   // token ids [B, T] (i64) or images [B, C, H, W] (f32)
  Tensor targets;  // next tokens [B, T] (i64) or labels [B] (i64)
  std::int64_t samples = 0;  // B
  std::int64_t targets_count = 0;  // elements of targets that count towards a mean loss (B*T or B)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;  // number of samples
  // One batch of the given samples, in that order (tensors allocated under MemoryCategory::data).
  // Must be safe to call from the loader's thread while the caller uses earlier batches.
  virtual Batch collate(const std::vector<std::int64_t>& indices) const = 0;
  virtual std::string describe() const = 0;  // one line for logs: kind, source, sample count
};

// Language-model windows over one or more llm.c token shards, read as one stream: sample i is tokens
// [i*T, i*T + T] of the stream (T+1 tokens: inputs are the first T, targets the last T), so consecutive
// samples share one token and none crosses the end. Shards are memory-mapped; every token is checked
// against vocab_size when the dataset opens (error names the shard, index and byte offset).
class TokenWindowDataset : public Dataset {
 public:
  TokenWindowDataset(const std::vector<std::string>& shard_paths, std::int64_t seq_len, std::int64_t vocab_size);
  std::int64_t size() const override;
  Batch collate(const std::vector<std::int64_t>& indices) const override;
  std::string describe() const override;
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t total_tokens() const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<std::int64_t> shard_starts_;  // offset of each shard in the stream
  std::int64_t seq_len_;
  std::int64_t vocab_size_;
};

// Samples with the shapes and dtypes of a real dataset and zeros for contents: what train::predict_memory needs
// from data (the bytes of each batch) without reading a corpus. inputs [B, input_shape...] in input_dtype,
// targets [B, target_shape...] i64 (zeros are valid token ids and class labels); targets_count = B times the
// elements of target_shape. E.g. GPT windows: ({T}, i64, {T}); images: ({C, H, W}, f32, {}).
class BlankDataset : public Dataset {
 public:
  BlankDataset(std::int64_t size, Shape input_shape, DType input_dtype, Shape target_shape);
  std::int64_t size() const override { return size_; }
  Batch collate(const std::vector<std::int64_t>& indices) const override;
  std::string describe() const override;

 private:
  std::int64_t size_;
  Shape input_shape_;
  DType input_dtype_;
  Shape target_shape_;
};

// Image classification samples: images [N, H, W] u8 (as read_idx returns) scaled to [0, 1] and normalised
// by (x - mean) / std, yielded as [B, 1, H, W] f32; labels [N] u8 as i64 [B]. Every label is checked to be
// < num_classes when the dataset is made (error names `source`, the sample index and the byte offset).
class ImageDataset : public Dataset {
 public:
  ImageDataset(Tensor images, Tensor labels, std::int64_t num_classes, std::string source, double mean = 0.0,
               double std = 1.0);
  // The Fashion-MNIST / MNIST pair <dir>/<split>-images-idx3-ubyte[.gz] + labels, split "train" or "t10k".
  static std::shared_ptr<ImageDataset> from_idx_dir(const std::string& dir, const std::string& split,
                                                    std::int64_t num_classes = 10, double mean = 0.2860,
                                                    double std = 0.3530);
  std::int64_t size() const override;
  Batch collate(const std::vector<std::int64_t>& indices) const override;
  std::string describe() const override;

 private:
  Tensor images_;
  Tensor labels_;
  std::int64_t num_classes_;
  std::string source_;
  double mean_;
  double std_;

  // The files from_idx_dir read, so errors can name them and the label's byte offset (8 + index) there.
  struct IdxFiles {
    std::string images;
    std::string labels;
  };
  ImageDataset(Tensor images, Tensor labels, std::int64_t num_classes, std::string source, double mean, double std,
               const IdxFiles& files);
};

// Fashion-MNIST's two splits from an IDX directory (from_idx_dir "train" and "t10k"), or, for a memory plan that
// reads no data (blank), stand-ins of the same sizes and shape: 60,000 and 10,000 blank f32 images 1x28x28.
struct ImageSplits {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> test;
  // The bytes the real splits hold in memory (u8 images and labels), also for the stand-ins: what a memory plan
  // adds for the data it did not read (train::RunInputs::resident_data_bytes).
  std::size_t loaded_bytes = 0;
};
ImageSplits fashion_mnist_splits(const std::string& dir, bool blank);

struct LoaderOptions {
  std::int64_t batch_size = 8;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = true;  // false: the last batch of an epoch may be smaller (never empty)
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::int64_t prefetch = 2;  // batches collated ahead; 0 = collate synchronously in next()
  // 0: ranks share samples (above). k > 0: ranks share whole batches instead. Every rank sees the batches of
  // the one-rank run (all samples, world_size 1); their stream is cut into groups of world_size * k, and rank
  // r takes batches [r*k, (r+1)*k) of each group. So global micro-batch i of a data-parallel step holds the
  // same samples at any world size (what bit-identical training across world sizes needs). Positions are
  // then positions in that global stream.
  std::int64_t batch_block = 0;
  void validate() const;  // batch_size >= 1, 0 <= rank < world_size, prefetch >= 0, batch_block >= 0
};

struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t batch = 0;  // batches of this epoch already handed out
  bool operator==(const LoaderPosition&) const = default;
};

// The samples rank `options.rank` visits in `epoch`, in order: the epoch's order (Fisher-Yates driven by
// Philox keyed by the seed, counters tagged apart from the global stream, or identity without shuffle),
// every world_size-th entry from rank, floor(N / world_size) of them so all ranks get the same count.
std::vector<std::int64_t> epoch_share(std::int64_t num_samples, const LoaderOptions& options, std::int64_t epoch);

class Loader {
 public:
  // Throws if the rank's share of one epoch holds no full batch (or no sample at all without drop_last).
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();  // stops and joins the worker
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch; after the last batch of an epoch comes batch 0 of the next epoch (new permutation).
  // An exception thrown by collate in the worker is rethrown here.
  Batch next();
  LoaderPosition position() const;
  // epoch >= 0, 0 <= batch < batches_per_epoch(); clears a stored error. With batch_block, `position` must
  // start a group (its global index a multiple of world_size * batch_block) and the loader goes on from this
  // rank's block of it.
  void seek(LoaderPosition position);
  std::int64_t batches_per_epoch() const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }
  // The sample indices of batch (epoch, k) for this rank (what collate receives); for tests and logs.
  // Draws the epoch's order afresh on each call: O(N) (next() keeps one per epoch instead).
  std::vector<std::int64_t> batch_indices(LoaderPosition position) const;

 private:
  struct Worker;
  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  LoaderPosition position_;
  std::unique_ptr<Worker> worker_;

  // Loader methods are called from one thread; the worker reads only dataset_ and options_, and has its
  // own ShareCache, so it shares nothing mutable with the caller except Worker's queue (under its mutex).
  struct ShareCache {
    std::int64_t epoch = -1;
    std::vector<std::int64_t> share;  // epoch_share of that epoch
  };
  ShareCache sync_cache_;  // for prefetch = 0
  LoaderPosition advance(LoaderPosition p) const;     // the next batch this rank takes
  LoaderPosition first_owned(LoaderPosition p) const;  // p, or the first batch after p this rank takes
  bool owns(LoaderPosition p) const;
  void check_position(LoaderPosition p, const char* where) const;
  std::vector<std::int64_t> slice_batch(const std::vector<std::int64_t>& share, std::int64_t batch) const;
  Batch collate_at(LoaderPosition p, ShareCache& cache) const;
  void start_worker();  // no thread when prefetch == 0
  void stop_worker();   // joins; drops the queue
};

}  // namespace memtrain::data
