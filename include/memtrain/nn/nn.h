// memtrain::nn: modules (named parameters, state_dict) and the GPT-2 model built from them.
#pragma once

#include "memtrain/nn/causal_self_attention.h"
#include "memtrain/nn/dropout.h"
#include "memtrain/nn/embedding.h"
#include "memtrain/nn/gpt.h"
#include "memtrain/nn/gpt_config.h"
#include "memtrain/nn/layer_norm.h"
#include "memtrain/nn/linear.h"
#include "memtrain/nn/mlp.h"
#include "memtrain/nn/module.h"
#include "memtrain/nn/rms_norm.h"
#include "memtrain/nn/transformer_block.h"
