// ImageDataset: u8 images and labels (MNIST-style IDX pairs) collated into normalised f32 batches.
#include "memtrain/core/allocator.h"
#include "memtrain/core/error.h"
#include "memtrain/data/idx.h"
#include "memtrain/data/loader.h"

#include <cmath>
#include <filesystem>

namespace memtrain::data {

namespace {
constexpr const char* kWhere = "ImageDataset";
constexpr std::int64_t kIdxLabelHeaderBytes = 8;  // magic + one dimension

// <dir>/<stem>.gz if present, else <dir>/<stem>; throws when neither exists.
std::string find_idx(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  for (const std::string& name : {stem + ".gz", stem}) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  detail::throw_error("ImageDataset::from_idx_dir",
                      fmt::format("'{}': neither '{}.gz' nor '{}' exists there", dir, stem, stem));
}
}  // namespace

ImageDataset::ImageDataset(Tensor images, Tensor labels, std::int64_t num_classes, std::string source, double mean,
                           double std)
    : ImageDataset(std::move(images), std::move(labels), num_classes, std::move(source), mean, std, IdxFiles{}) {}

ImageDataset::ImageDataset(Tensor images, Tensor labels, std::int64_t num_classes, std::string source, double mean,
                           double std, const IdxFiles& files)
    : num_classes_(num_classes), source_(std::move(source)), mean_(mean), std_(std) {
  const std::string& src = source_;
  MT_CHECK(images.defined() && labels.defined(), kWhere, "'{}': images or labels tensor is undefined", src);
  MT_CHECK(images.dtype() == DType::u8 && images.dim() == 3, kWhere,
           "'{}': images must be u8 [N, H, W], got {} {}", src, dtype_name(images.dtype()), shape_str(images.shape()));
  MT_CHECK(labels.dtype() == DType::u8 && labels.dim() == 1, kWhere, "'{}': labels must be u8 [N], got {} {}", src,
           dtype_name(labels.dtype()), shape_str(labels.shape()));
  if (files.labels.empty()) {
    MT_CHECK(images.size(0) == labels.size(0), kWhere, "'{}': {} images {} but {} labels", src, images.size(0),
             shape_str(images.shape()), labels.size(0));
  } else {
    MT_CHECK(images.size(0) == labels.size(0), kWhere, "'{}' holds {} images {} but '{}' holds {} labels",
             files.images, images.size(0), shape_str(images.shape()), files.labels, labels.size(0));
  }
  MT_CHECK(num_classes >= 1, kWhere, "'{}': num_classes {} must be >= 1", src, num_classes);
  MT_CHECK(std > 0.0 && std::isfinite(std) && std::isfinite(mean), kWhere,
           "'{}': normalisation mean {} / std {} must be finite with std > 0", src, mean, std);
  {
    CategoryGuard guard(MemoryCategory::data);
    // Batches are gathered on the host (the loader copies each one to the model's device): tensors given on
    // another device are copied here once; CPU tensors are kept without a copy when contiguous.
    images_ = images.to(Device::cpu()).contiguous();
    labels_ = labels.to(Device::cpu()).contiguous();
  }
  // Checked once here: a bad label would otherwise surface as an out-of-range index inside the loss.
  const auto* lab = labels_.data<std::uint8_t>();
  for (std::int64_t i = 0; i < labels_.size(0); ++i) {
    if (lab[i] < num_classes) continue;
    if (files.labels.empty())
      detail::throw_error(kWhere, fmt::format("'{}': label {} of sample {} (byte offset {} of the labels) is >= "
                                              "num_classes {}",
                                              src, lab[i], i, i, num_classes));
    detail::throw_error(kWhere, fmt::format("'{}': label {} of sample {} at offset {} is >= num_classes {}",
                                            files.labels, lab[i], i, kIdxLabelHeaderBytes + i, num_classes));
  }
}

std::shared_ptr<ImageDataset> ImageDataset::from_idx_dir(const std::string& dir, const std::string& split,
                                                         std::int64_t num_classes, double mean, double std) {
  IdxFiles files{find_idx(dir, split + "-images-idx3-ubyte"), find_idx(dir, split + "-labels-idx1-ubyte")};
  Tensor images = read_idx(files.images);
  Tensor labels = read_idx(files.labels);
  return std::shared_ptr<ImageDataset>(new ImageDataset(std::move(images), std::move(labels), num_classes,
                                                        files.images, mean, std, files));
}

std::int64_t ImageDataset::size() const { return images_.size(0); }

Batch ImageDataset::collate(const std::vector<std::int64_t>& indices) const {
  MT_CHECK(!indices.empty(), "ImageDataset::collate", "no sample indices");
  const auto b = static_cast<std::int64_t>(indices.size());
  const std::int64_t h = images_.size(1), w = images_.size(2), hw = h * w;
  Batch batch;
  {
    CategoryGuard guard(MemoryCategory::data);
    batch.inputs = Tensor::empty({b, 1, h, w}, DType::f32);  // (B,1,H,W)
    batch.targets = Tensor::empty({b}, DType::i64);          // (B)
  }
  // (x / 255 - mean) / std as one multiply-add per pixel.
  const auto scale = static_cast<float>(1.0 / (255.0 * std_));
  const auto shift = static_cast<float>(-mean_ / std_);
  const auto* src = images_.data<std::uint8_t>();
  const auto* lab = labels_.data<std::uint8_t>();
  auto* out = batch.inputs.data<float>();
  auto* tgt = batch.targets.data<std::int64_t>();
  for (std::int64_t row = 0; row < b; ++row) {
    const std::int64_t i = indices[static_cast<std::size_t>(row)];
    MT_CHECK(i >= 0 && i < size(), "ImageDataset::collate", "sample index {} is outside [0, {})", i, size());
    const std::uint8_t* px = src + i * hw;
    for (std::int64_t k = 0; k < hw; ++k) out[row * hw + k] = static_cast<float>(px[k]) * scale + shift;
    tgt[row] = lab[i];
  }
  batch.samples = b;
  batch.targets_count = b;
  return batch;
}

std::string ImageDataset::describe() const {
  return fmt::format("ImageDataset: '{}', {} images 1x{}x{}, {} classes", source_, size(), images_.size(1),
                     images_.size(2), num_classes_);
}

ImageSplits fashion_mnist_splits(const std::string& dir, bool blank) {
  constexpr std::size_t kImages = 60000 + 10000, kBytesPerImage = 28 * 28 + 1;  // pixels and a label, u8
  if (blank)
    return {std::make_shared<BlankDataset>(60000, Shape{1, 28, 28}, DType::f32, Shape{}),
            std::make_shared<BlankDataset>(10000, Shape{1, 28, 28}, DType::f32, Shape{}), kImages * kBytesPerImage};
  auto train = ImageDataset::from_idx_dir(dir, "train");
  auto test = ImageDataset::from_idx_dir(dir, "t10k");
  const std::size_t loaded = static_cast<std::size_t>(train->size() + test->size()) * kBytesPerImage;
  return {std::move(train), std::move(test), loaded};
}

}  // namespace memtrain::data
