# shellcheck shell=bash
# Environment for building and testing ckpt-tensor's `tch` feature against the torch in the project venv.
#
#   source scripts/tch-env.sh
#   cargo test -p ckpt-tensor --features tch
#
# torch-sys (tch's FFI crate) finds libtorch by running `python -c 'import torch ...'` when
# LIBTORCH_USE_PYTORCH is set; it runs `python` when VIRTUAL_ENV is set and `python3` otherwise, so the
# venv is put first on PATH. tch 0.26 expects exactly torch 2.13.0, which is what the venv holds, so no
# LIBTORCH_BYPASS_VERSION_CHECK is needed (set it yourself to try another torch).
#
# The venv's torch is the CUDA wheel (torch 2.13.0+cu130). torch-sys passes -ltorch_cuda when
# libtorch_cuda.so exists, but rustc links with --as-needed and nothing references a CUDA symbol, so the
# binaries only need libtorch_cpu.so and libc10.so at run time: LD_LIBRARY_PATH gets torch/lib alone. (At link
# time GNU ld finds libtorch_cuda.so's own CUDA dependencies through its RPATH, $ORIGIN/../../nvidia/...;
# the site-packages/nvidia/*/lib directories need not be on any path.) Nothing here needs a GPU.

_tch_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
_tch_venv="${_tch_root}/.venv"
if [ ! -x "${_tch_venv}/bin/python" ]; then
    echo "tch-env.sh: no python in ${_tch_venv} (create the project venv first)" >&2
    return 1 2>/dev/null || exit 1
fi
_tch_site="$("${_tch_venv}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
_tch_torch_lib="${_tch_site}/torch/lib"
if [ ! -d "${_tch_torch_lib}" ]; then
    echo "tch-env.sh: torch is not installed in ${_tch_venv}" >&2
    return 1 2>/dev/null || exit 1
fi

export VIRTUAL_ENV="${_tch_venv}"
case "${PATH}" in
    "${_tch_venv}/bin:"*) ;;
    *) export PATH="${_tch_venv}/bin:${PATH}" ;;
esac
export LIBTORCH_USE_PYTORCH=1
# A target directory of its own: compiling torch-sys's C++ takes many minutes, and cargo locks a target
# directory for the whole of a build, so sharing /target would stall every other cargo command meanwhile.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${_tch_root}/target/tch}"

case ":${LD_LIBRARY_PATH:-}:" in
    *":${_tch_torch_lib}:"*) ;;
    *) export LD_LIBRARY_PATH="${_tch_torch_lib}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;;
esac

unset _tch_root _tch_venv _tch_site _tch_torch_lib
