// Umbrella header for the optimizers: the base class, every optimizer, the 8-bit factories and Spec.
#pragma once

#include "memtrain/optim/adafactor.h"
#include "memtrain/optim/adamw.h"
#include "memtrain/optim/factories.h"
#include "memtrain/optim/lion.h"
#include "memtrain/optim/optimizer.h"
#include "memtrain/optim/sgd.h"
#include "memtrain/optim/spec.h"
