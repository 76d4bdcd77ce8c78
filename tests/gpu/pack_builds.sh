#!/usr/bin/env bash
# Packs several builds into one bundle, to compare them on one device machine in one call:
#   bash tests/gpu/pack_builds.sh main=build-gpu/bin_main.tar.xz pr=build-gpu/bin_pr.tar.xz ...
# Each BUNDLE is a build_portable.sh bundle (build-gpu/bin.tar.xz, copied aside after each build). The result,
# build-gpu/bin.tar.xz (DI_PACK_OUT names another), holds the first build's files as they are, so that
# device_check.sh and tests/gpu/run.sh test that build, and every build's deepinfer under NAME/. On the device
# DI_AB_BUILDS="main pr" bash bench/gpu/ab_matrix.sh "" runs them in turn.
# Why: the device takes at most 64 MiB of tree and carried files, the tree is ~47 MB and each bundle ~11.5 MB.
# Builds of one source differ little, so xz with a dictionary wider than one binary (48 MB) stores each further
# deepinfer in a fraction of an MB: four builds with the tests and op_bench came to 12.2 MB (twenty-ninth session).
set -euo pipefail
(($# > 0)) || { echo "usage: pack_builds.sh NAME=BUNDLE [NAME=BUNDLE ...]" >&2; exit 2; }
out=$(realpath -m "${DI_PACK_OUT:-$(dirname "$0")/../../build-gpu/bin.tar.xz}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for arg in "$@"; do
  name=${arg%%=*} bundle=${arg#*=}
  if [[ $arg != *=* || ! $name =~ ^[A-Za-z0-9_-]+$ || $name =~ ^(deepinfer|tests|bench)$ ]]; then
    echo "pack_builds.sh: '$arg' is not NAME=BUNDLE (NAME: letters, digits, _ and -; not deepinfer, tests or bench," \
      "the bundle's own files)" >&2
    exit 2
  fi
  [[ -f $bundle ]] || { echo "pack_builds.sh: $name: no bundle at $bundle" >&2; exit 2; }
  [[ ! -e $stage/$name ]] || { echo "pack_builds.sh: build name $name given twice" >&2; exit 2; }
  if [[ ! -e $stage/deepinfer ]]; then  # the first build: all its files, its deepinfer also under its name
    tar -xJf "$bundle" -C "$stage"
    [[ -f $stage/deepinfer ]] || { echo "pack_builds.sh: $name: $bundle has no deepinfer" >&2; exit 2; }
    mkdir "$stage/$name"
    ln "$stage/deepinfer" "$stage/$name/deepinfer"  # a hard link: tar stores it once
  else
    mkdir "$stage/$name"
    tar -xJf "$bundle" -C "$stage/$name" deepinfer 2>/dev/null ||
      { echo "pack_builds.sh: $name: $bundle has no deepinfer" >&2; exit 2; }
  fi
done
# the binaries next to each other, so that each is within the dictionary's reach of the one before
(cd "$stage" && find . -type f | sort | tar -cf - -T - | xz -T1 --lzma2=preset=9,dict=256MiB >"$out")
ls -la "$out"
