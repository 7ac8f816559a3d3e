// The training layer: TrainerConfig (a run as a JSON-round-tripping value), the Trainer that runs it, and
// predict_memory, which runs it on the meta device first to say what it will hold.
#pragma once

#include "memtrain/train/classifier_eval.h"
#include "memtrain/train/fit.h"
#include "memtrain/train/metrics_plot.h"
#include "memtrain/train/pipeline.h"
#include "memtrain/train/tensor_parallel.h"
#include "memtrain/train/predict.h"
#include "memtrain/train/timeline.h"
#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"
