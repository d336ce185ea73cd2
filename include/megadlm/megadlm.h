// Umbrella header for programs that use libmegadlm (library code includes precise headers).
#pragma once
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/data/sample_source.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/training/trainer.h"
#include "megadlm/training/training_config.h"
