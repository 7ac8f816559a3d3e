// dist::attach_gpt_pipeline: a train::PipelineLink over a Communicator's point-to-point messages. A tensor
// travels as two messages with the same tag: a header (dtype, rank, sizes), then its bytes.
//
// While sends are in flight a thread of the link tests them every 50 us. MPI moves a large message's bytes only
// while the sender is inside an MPI call, unless the receiver can copy them out of the sender's memory itself
// (Open MPI's CMA, often not permitted in a container): without the thread, a stage that sends its output and
// goes on computing would hold the next stage up until its own next receive.
#include "memtrain/dist/pipeline.h"

#include "dist/same_config.h"

#include "memtrain/core/error.h"
#include "memtrain/train/pipeline.h"


#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace memtrain::dist {

namespace {

constexpr std::int64_t kMaxDims = 6;
constexpr std::int64_t kHeaderLength = 2 + kMaxDims;  // dtype, rank, sizes

class CommunicatorLink final : public train::PipelineLink {
 public:
  explicit CommunicatorLink(std::shared_ptr<Communicator> comm)
      : comm_(std::move(comm)), progress_([this] { progress(); }) {}
  ~CommunicatorLink() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    progress_.join();
    try {
      flush_sends();
    } catch (const std::exception&) {  // each PendingSend reports its own failure as it goes
    }
  }
  int stage() const override { return comm_->rank(); }
  int stages() const override { return comm_->size(); }

  void send(const Tensor& t, int to, int tag) override {
    MT_CHECK(t.dim() <= kMaxDims, "pipeline send", "a tensor of {} dimensions (at most {})", t.dim(), kMaxDims);
    Tensor header = Tensor::empty({kHeaderLength}, DType::i64, Device::cpu());
    auto* h = header.data<std::int64_t>();
    std::fill(h, h + kHeaderLength, 0);
    h[0] = static_cast<std::int64_t>(t.dtype());
    h[1] = t.dim();
    for (std::int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
    auto sent_header = comm_->send(header, to, Communicator::kFirstUserTag + tag);
    auto sent_bytes = comm_->send(t.contiguous(), to, Communicator::kFirstUserTag + tag);
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(sent_header));
      pending_.push_back(std::move(sent_bytes));
    }
    wake_.notify_all();
  }

  Tensor receive(int from, int tag) override {
    Tensor header = Tensor::empty({kHeaderLength}, DType::i64, Device::cpu());
    comm_->recv(header, from, Communicator::kFirstUserTag + tag);
    const auto* h = header.data<std::int64_t>();
    MT_CHECK(h[1] >= 0 && h[1] <= kMaxDims && h[0] >= 0 && h[0] < kNumDTypes, "pipeline receive",
             "rank {} sent a header of dtype {} and rank {} (tag {})", from, h[0], h[1], tag);
    Tensor t = Tensor::empty(Shape(h + 2, h + 2 + h[1]), static_cast<DType>(h[0]), Device::cpu());
    comm_->recv(t, from, Communicator::kFirstUserTag + tag);
    return t;
  }

  void reap_sends() override {
    std::lock_guard lock(mutex_);
    reap_locked();
  }
  void flush_sends() override {
    std::deque<std::unique_ptr<Communicator::PendingSend>> waiting;
    {
      std::lock_guard lock(mutex_);
      waiting.swap(pending_);
    }
    for (auto& p : waiting) p->wait();
  }
  std::vector<double> gather_f64(const std::vector<double>& mine) override { return comm_->all_gather_f64(mine); }
  std::vector<std::int64_t> gather_i64(const std::vector<std::int64_t>& mine) override {
    return comm_->all_gather_i64(mine);
  }

 private:
  void reap_locked() {
    while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
  }
  void progress() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (pending_.empty()) {
        wake_.wait(lock);
        continue;
      }
      try {
        reap_locked();
      } catch (const std::exception&) {  // the sender's own wait or flush reports it
      }
      wake_.wait_for(lock, std::chrono::microseconds(50));
    }
  }

  std::shared_ptr<Communicator> comm_;
  std::mutex mutex_;  // pending_ and stop_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Communicator::PendingSend>> pending_;
  bool stop_ = false;
  std::thread progress_;  // last: started once the members it uses exist
};

}  // namespace

void attach_gpt_pipeline(train::Trainer& trainer, std::shared_ptr<const nn::GPT> stage_model,
                         std::shared_ptr<Communicator> comm) {
  const char* where = "dist::attach_gpt_pipeline";
  MT_CHECK(stage_model != nullptr && comm != nullptr, where, "the stage model or the group is null");
  const train::TrainerConfig& config = trainer.config();
  const nn::GPTStage& stage = stage_model->stage();
  MT_CHECK(config.pipeline_stages == comm->size(), where,
           "config.pipeline_stages is {} but the group has {} ranks (launch with mpirun -np {})",
           config.pipeline_stages, comm->size(), config.pipeline_stages);
  MT_CHECK(stage.count == comm->size() && stage.index == comm->rank(), where,
           "the model is stage {} of {}, but this is rank {} of {}: build it with GPTStage{{rank, size}}",
           stage.index, stage.count, comm->rank(), comm->size());
  // Every rank must run the same step: the same config, compared whole.
  detail::require_same_config(config.to_json(), *comm, where);
  trainer.attach_pipeline(std::make_shared<CommunicatorLink>(std::move(comm)), std::move(stage_model));
}

}  // namespace memtrain::dist
