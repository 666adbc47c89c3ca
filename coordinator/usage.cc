#include "coordinator/usage.h"

#include <iostream>

namespace kvmesh::coordinator {

const char kUsage[] =
    "usage: kvmesh <command> [flags]        (kvmesh help, or --help / -h after any command)\n"
    "  run       --prompt TEXT | --session FILE | --prompts FILE [--model PATH] [--chat]\n"
    "            [--max-tokens N]\n"
    "            [--temperature T] [--no-prefix-reuse]\n"
    "            [--top-k K] [--top-p P] [--repeat-penalty R] [--seed S] [--threads N]\n"
    "            [--ctx-size N] [--json] [--ignore-eos] [--tp T] [--pp P] [--dp D] [--print-plan]\n"
    "            [--kv-cache-mem MiB] [--block-size 16] [--max-seqs 16]\n"
    "            [--max-batched-tokens 512] [--max-waiting 1024] [--max-sessions 256]\n"
    "            [--tp-collectives shm|mpi]\n"
    "            [--activation-bits 16|8]  (8: ggml's numerics, faster batched)\n"
    "            [--attention-bits 32|16]  (16: bf16 operands, faster with many sequences)\n"
    "            [--no-repack]  (the file's row-major weights: no extra bytes, slower)\n"
    "            (parallel: mpirun -np D*T*P kvmesh run --dp D --tp T --pp P ...)\n"
    "  serve     [--config FILE.yaml] [--host 127.0.0.1] [--port 8000]\n"
    "            [--api-key KEY | --api-key-file F]\n"
    "            [--max-body-bytes N] [--served-model-name NAME] [--prefix-reuse]\n"
    "            [--http-timeout 60: seconds a client may take to send a request, or to\n"
    "            take each write of its answer]\n"
    "            (over the config's enable_prefix_caching: false) + run's model and serving flags\n"
    "            OpenAI-compatible HTTP: /v1/completions /v1/chat/completions /v1/models\n"
    "            /health /metrics (under mpirun for --dp/--tp/--pp); cluster RPC on --rpc-port\n"
    "            (8001; --no-rpc to disable; --rpc-frame-timeout 60: seconds a frame may take,\n"
    "            in or out)\n"
    "  client    health|tokenize|generate|chat|session|status|stats [--host H] [--port 8001]\n"
    "            [--api-key K | --api-key-file F] (--text T [--no-special] | --prompt T |\n"
    "            --message T [--system S] | --id ID --turns FILE) [--max-tokens N]\n"
    "            [--temperature T] [--seed S] [--n N (generate, chat: 1-16 choices)]\n"
    "            the cluster RPC API\n"
    "  tokenize  --text TEXT [--model PATH] [--no-special]\n"
    "  logits    --prompt TEXT [--model PATH] [--top-k K] [--print-plan] [--no-repack]\n"
    "            + run's launch flags (--threads, --tp, --pp, ...)\n"
    "  bench     [--model PATH | -m PATH] [-p 512] [-n 128] [-t N,...] (default: all CPUs)\n"
    "            [-d N,...] (default 0) [-r 5] [--json]\n"
    "            [--no-bandwidth]   llama-bench's pp/tg tests on this engine\n"
    "  model pull   download SmolLM2-135M-Instruct (Q4_1 GGUF) into $KVMESH_CACHE\n";

int PrintHelp() {
  std::cout << kUsage;
  return 0;
}

}  // namespace kvmesh::coordinator
