// The training layer: TrainerConfig (a run as a JSON-round-tripping value) and the Trainer that runs it.
#pragma once

#include "memtrain/train/trainer.h"
#include "memtrain/train/trainer_config.h"
