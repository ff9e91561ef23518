#!/usr/bin/env bash
# Installs torch VERSION from PyPI into a virtual environment outside the clone, which later
# runs reuse, and prints the environment's python on the last line of stdout.
#
#   scripts/setup_torch.sh 2.15.0        # -> $LOOM_PY_ENVS/torch-2.15.0/bin/python
#
# LOOM_PY_ENVS (default ~/.cache/loom/py) holds the environments. The environment is built
# beside its final place and renamed into it only once `import torch` works, so an interrupted
# install never leaves a broken one that a later run would trust.
#
# PyPI's Linux wheels of torch 2.x are CUDA builds that pull several GB of NVIDIA libraries.
# Loom's torch backend is a CPU backend, and a machine of this project's kind has the CUDA
# toolkit and cuDNN in /usr/local/cuda. So when the wheel's CUDA major version is the one in
# /usr/local/cuda, the toolkit and cuDNN packages are left out and the system's libraries serve
# (torch loads them through the loader path); the smaller NVIDIA packages are still installed
# (the toolkit's cuFile, and NCCL, cuSPARSELt and NVSHMEM, which /usr/local/cuda lacks or has in
# an older version). triton (torch.compile's GPU code generator) is left out. If `import torch`
# then fails, everything the wheel asks for is installed and the import is tried again.
#
# Exit codes: 0 ready; 3 PyPI unreachable (the caller skips, saying so); 1 anything else.
set -euo pipefail

version=${1:?usage: scripts/setup_torch.sh VERSION (e.g. 2.15.0)}
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
  echo "setup_torch: version '$version' is not of the form M.m or M.m.p" >&2
  exit 1
fi
envs=${LOOM_PY_ENVS:-$HOME/.cache/loom/py}
env="$envs/torch-$version"
base_python=${LOOM_BASE_PYTHON:-/usr/bin/python3}
check='import sys, torch, torch.distributed as d
v = torch.__version__.split("+")[0]
sys.exit(0 if v == sys.argv[1] and d.is_available() else 1)'

if [[ -x "$env/bin/python" ]] && "$env/bin/python" -c "$check" "$version" 2>/dev/null; then
  echo "setup_torch: torch $version ready in $env" >&2
  echo "$env/bin/python"
  exit 0
fi

# A python without pip or venv is a missing install step, not an unreachable PyPI: say which.
# (Debian's python3 has neither until python3-pip and python3-venv are installed; scripts/setup.sh
# installs them.)
for module in pip venv ensurepip; do
  if ! "$base_python" -c "import $module" 2>/dev/null; then
    echo "setup_torch: $base_python has no '$module' module, which building torch $version's environment needs; on Debian: apt-get install python3-pip python3-venv (scripts/setup.sh installs them), or point LOOM_BASE_PYTHON at a python that has pip and venv" >&2
    exit 1
  fi
done
probe_rc=0
probe_err=$(timeout 60 "$base_python" -m pip index versions torch 2>&1 >/dev/null) || probe_rc=$?
if ((probe_rc != 0)); then
  if ((probe_rc == 124)); then
    why="no answer within 60 s"
  else
    # pip's last line is often only "No matching distribution found"; the reason (a refused
    # connection, a certificate it does not trust) is on its "Could not fetch URL" line, or on
    # its last "Retrying ... after connection broken by" line.
    line=$(grep -m1 "Could not fetch URL" <<<"$probe_err" ||
      grep "Retrying" <<<"$probe_err" | tail -1 || true)
    [[ -n "$line" ]] || line=$(tail -1 <<<"${probe_err:-no output}")
    why="exit $probe_rc: ${line:0:400}"
  fi
  echo "setup_torch: PyPI unreachable ('pip index versions torch' failed, $why); torch $version not installed" >&2
  exit 3
fi

mkdir -p "$envs"
tmp="$env.partial.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
"$base_python" -m venv "$tmp"
py="$tmp/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
echo "setup_torch: installing torch $version into $env" >&2
"${pip[@]}" --no-deps "torch==$version"

# The wheel's own requirements (markers evaluated for this machine), split into what the slim
# install takes and what it leaves to /usr/local/cuda.
mapfile -t reqs < <("$py" - <<'EOF'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("torch") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    print(str(r).split(";")[0].strip())
EOF
)
system_cuda=""
if compgen -G "/usr/local/cuda/lib64/libcudart.so.*" >/dev/null; then
  system_cuda=$(basename "$(ls /usr/local/cuda/lib64/libcudart.so.[0-9]* | head -1)")
  system_cuda=${system_cuda#libcudart.so.}
  system_cuda=${system_cuda%%.*}
fi
slim=()
for r in "${reqs[@]}"; do
  name=${r%%[<>=~![ ]*}
  case "$name" in
    triton) continue ;;
    cuda-toolkit)
      # cuda-toolkit[cublas,cudart,cufft,cufile,...]==13.x: the system has all but cuFile.
      if [[ -n "$system_cuda" && "$r" == *"==$system_cuda."* ]]; then
        [[ "$r" == *cufile* ]] && slim+=("nvidia-cufile")
        continue
      fi
      ;;
    nvidia-cudnn-cu*)
      if [[ -n "$system_cuda" && "$name" == *"-cu$system_cuda" ]] &&
        compgen -G "/usr/local/cuda/lib64/libcudnn.so.*" >/dev/null; then
        continue
      fi
      ;;
    cuda-bindings) continue ;;  # Python bindings for CUDA; the CPU backend never imports them
  esac
  slim+=("$r")
done
# torch before 2.3 was compiled against NumPy 1.x and warns on import beside NumPy 2.
numpy=numpy
if [[ "$version" =~ ^2\.[0-2](\.|$) ]]; then
  numpy="numpy<2"
fi
"${pip[@]}" "${slim[@]}" pytest "$numpy"
echo "setup_torch: (pip's lines above on requirements 'not installed' name what the slim install left to /usr/local/cuda)" >&2
if ! "$py" -c "$check" "$version" 2>"$tmp/import.err"; then
  echo "setup_torch: the slim install does not import ($(tail -1 "$tmp/import.err")); installing all of torch's requirements" >&2
  "${pip[@]}" "torch==$version"
  "$py" -c "$check" "$version"
fi
rm -rf "$env"
mv "$tmp" "$env"
trap - EXIT
echo "setup_torch: torch $version ready in $env ($(du -sh "$env" | cut -f1))" >&2
echo "$env/bin/python"
