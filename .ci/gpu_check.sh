#!/usr/bin/env bash
# The CUDA paths that run without Ray or vLLM/veRL, for a GPU machine that reaches no package
# registry (this workplace's device tool: its python3 has torch, transformers and pytest, and
# that is all these tests import besides the project's own source):
#   - the transformers engine's own sampling loop and lean decoding step on the GPU, fp32 and
#     bf16, against transformers' generate;
#   - the native trainer's shared-prompt forward under bf16 autocast on the GPU;
#   - an NCCL weight broadcast between two GPUs (skipped, with its reason, on one GPU).
# Every test here is skipped with a reason on a machine without CUDA; run it where one exists:
#   bash .ci/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))"
PYTHONPATH=trinity-core/src python3 -m pytest -q -p no:cacheprovider -rs -o addopts="" \
    "trinity-core/tests/explorer/test_transformers_engine.py::test_own_loop_on_the_gpu_samples_what_generate_samples" \
    "trinity-core/tests/trainer/test_shared_prompt.py::test_shared_pass_under_bf16_autocast_passes_its_check" \
    "trinity-core/tests/sync/test_broadcast.py::test_nccl_backend_on_one_gpu_per_rank" \
    "$@"
