// Pipeline parallelism over the MPI group (memtrain/train/pipeline.h has how a pipeline runs): each rank of
// `comm` is one stage of a GPT.
#pragma once

#include "memtrain/dist/communicator.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/train/trainer.h"

#include <memory>

namespace memtrain::dist {

// Makes `trainer` (built over `stage_model`, a GPT made with GPTStage{comm->rank(), comm->size()}) one stage of
// a pipeline over `comm`: refused before the first step, when the config's pipeline_stages is not comm's size,
// when the model's stage is not this rank's, or when the ranks' configs differ (naming the ranks).
void attach_gpt_pipeline(train::Trainer& trainer, std::shared_ptr<const nn::GPT> stage_model,
                         std::shared_ptr<Communicator> comm = world());

}  // namespace memtrain::dist
