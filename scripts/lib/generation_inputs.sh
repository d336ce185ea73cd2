# Shared by scripts/device_trace.sh and scripts/device_generation_speed.sh: the inputs of a
# generation timing on the 1.7B architecture (speed does not depend on the weights).
#   save_random_checkpoint BIN DIR LOG   a randomly initialised configs/megadlms_1.7b.args model,
#                                        one step on mock data, weights only, saved to DIR
#   write_ragged_prompts FILE            16 prompts of 32 - (i % 4) random ids (padding exercised)
save_random_checkpoint() {
  "$1/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device "${DEVICE:-cuda}" --train-iters 1 \
    --global-batch-size 4 --lr-warmup-iters 0 --lr-decay-iters 10 --lr-wsd-decay-iters 1 --log-interval 1 \
    --eval-iters 0 --save "$2" --save-interval 1 --no-save-optim > "$3" 2>&1
}
write_ragged_prompts() {
  python3 - "$1" <<'P'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"prompt_ids": [random.randrange(1, 50000) for _ in range(32 - (i % 4))]}) + "\n")
P
}
