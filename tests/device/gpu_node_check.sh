#!/bin/bash
# The agent on a machine with an NVIDIA GPU (README.md): the agent's wheel installed offline into a
# fresh virtual environment, NVML read directly, then the installed attune-agent registering with
# tests/device/recording_service.py and running the recorded start command as a job owner's account.
# Usage: tests/device/gpu_node_check.sh WHEELHOUSE COMMANDS.json OUT_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
wheels=$1 commands=$2 out=$3
python=$(command -v python3)
nvidia-smi -L
id devuser >/dev/null 2>&1 || useradd -m -u 1500 devuser
rm -rf /tmp/attune-agent-venv /srv/attune-agent-check
"$python" -m venv /tmp/attune-agent-venv
/tmp/attune-agent-venv/bin/pip install -q --no-index --find-links "$wheels" attune-agent
/tmp/attune-agent-venv/bin/attune-agent --help | head -2
/tmp/attune-agent-venv/bin/python -c "
from agent.gpus import select_gpu_backend
backend = select_gpu_backend(fake_gpus=None, agent_name='check')
print(backend.name, backend.inventory(), backend.sample(()))"
"$python" "$here/recording_service.py" 18765 "$out/requests.jsonl" "$commands" &
service=$!
sleep 1
mkdir -p /srv/attune-agent-check && cd /srv/attune-agent-check
timeout 25 env ATTUNE_AGENT_TOKEN=check /tmp/attune-agent-venv/bin/attune-agent \
    --server http://127.0.0.1:18765 --name gpunode --workload-python "$python" > "$out/agent.log" 2>&1
kill $service
grep -E "started lease|exited|cannot start" "$out/agent.log"
cat /tmp/attune-*.out
