#!/usr/bin/env bash
# tools/source-fingerprint.sh: the same tree gives the same digest wherever it lies, and a
# changed byte, an added file or a renamed file change it; a folder without sources is an error.
# Usage: test_source_fingerprint.sh SCRIPT WORKDIR
set -u
script=$1 dir=$2
fail() { echo "$*"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/a/gpu/src" "$dir/a/tools" "$dir/a/build"
printf 'kernel\n' >"$dir/a/gpu/src/k.cu"
printf 'tool\n' >"$dir/a/tools/t.sh"
printf 'cmake_minimum_required(VERSION 3.25)\n' >"$dir/a/CMakeLists.txt"
a=$(bash "$script" "$dir/a") || fail "no digest for a plain tree"
[[ $a =~ ^[0-9a-f]{64}$ ]] || fail "not a SHA-256: '$a'"
cp -r "$dir/a" "$dir/b"
b=$(bash "$script" "$dir/b")
[ "$a" = "$b" ] || fail "a copy of the tree differs: $a vs $b"
printf 'object\n' >"$dir/b/build/k.o"  # not a source folder
[ "$(bash "$script" "$dir/b")" = "$a" ] || fail "a build output changed the digest"
printf 'kernel!\n' >"$dir/b/gpu/src/k.cu"
[ "$(bash "$script" "$dir/b")" != "$a" ] || fail "a changed byte kept the digest"
cp "$dir/a/gpu/src/k.cu" "$dir/b/gpu/src/k.cu"
printf 'x\n' >"$dir/b/tools/new.sh"
[ "$(bash "$script" "$dir/b")" != "$a" ] || fail "an added file kept the digest"
rm "$dir/b/tools/new.sh" && mv "$dir/b/tools/t.sh" "$dir/b/tools/u.sh"
[ "$(bash "$script" "$dir/b")" != "$a" ] || fail "a renamed file kept the digest"
mkdir -p "$dir/empty"
err=$(bash "$script" "$dir/empty" 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || fail "a folder without sources: exit code $rc, expected 2"
case $err in *"no sources"*) ;; *) fail "no message naming the problem: '$err'" ;; esac
echo "digest $a"
