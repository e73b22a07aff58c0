#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf with .gguf.inp/.gguf.out)
# into DIR, for crates/tessera-llm/tests/tokenizer.rs:
#
#   dev/fetch-vocab.sh DIR && TESSERA_VOCAB_DIR=DIR cargo test -p tessera-llm --test tokenizer
#
# They ship in the source distribution of llama-cpp-python (vendor/llama.cpp/models/), which is
# downloaded with pip (about 77 MB) unless a copy is at $TESSERA_LLAMA_CPP_SDIST (default
# /tmp/dl/llama_cpp_python-$VERSION.tar.gz). Does nothing when DIR already has the files.
set -euo pipefail

VERSION="0.3.36"
dir="${1:?usage: $0 DIR}"

have_all=1
for v in gpt-2 llama-bpe qwen2 llama-spm; do
  for ext in gguf gguf.inp gguf.out; do
    [ -s "$dir/ggml-vocab-$v.$ext" ] || have_all=0
  done
done
if [ "$have_all" = 1 ]; then
  echo "fetch-vocab: $dir already has the llama.cpp vocab test files"
  exit 0
fi

mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

sdist="${TESSERA_LLAMA_CPP_SDIST:-/tmp/dl/llama_cpp_python-$VERSION.tar.gz}"
if [ ! -f "$sdist" ]; then
  echo "fetch-vocab: downloading the llama-cpp-python $VERSION source distribution (about 77 MB)"
  # Only this package from source: pip still prepares the sdist's metadata in an isolated build
  # environment, and with --no-binary :all: it would build cmake and ninja from source for it.
  python3 -m pip download --no-deps --no-binary llama-cpp-python -d "$tmp" \
    "llama-cpp-python==$VERSION"
  sdist="$tmp/llama_cpp_python-$VERSION.tar.gz"
fi

prefix="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
tar -xzf "$sdist" -C "$tmp" --wildcards "$prefix/ggml-vocab-*"
cp "$tmp/$prefix"/ggml-vocab-* "$dir/"
echo "fetch-vocab: $(ls "$dir"/ggml-vocab-*.gguf | wc -l) vocab files in $dir"
