#!/usr/bin/env bash
# Download the text datasets read by latentstruct.data.text into the layout its readers expect:
#
#   $DIR/sst/{train,dev,test}.txt                 load_sst($DIR/sst)       (Stanford Sentiment Treebank, PTB trees)
#   $DIR/snli/snli_1.0_{train,dev,test}.jsonl     load_snli($DIR/snli)     (SNLI 1.0, official jsonl)
#   $DIR/glove/glove.840B.300d.txt                read_glove(...)          (GloVe Common Crawl 840B, cased, 300d)
#
# Usage: scripts/download_text_data.sh [DIR]        (DIR defaults to data/)
# Environment:
#   DATASETS="sst snli glove"   which datasets to fetch (GloVe 840B is a ~2.0 GB zip, ~5.6 GB unpacked)
#   KEEP_ARCHIVES=1             keep the downloaded zips in $DIR/archives (default: delete them after unpacking)
#   SST_SHA256, SNLI_SHA256, GLOVE_SHA256   expected sha256 of each zip, checked when set (see below)
#
# Files that already exist are not downloaded again. Needs curl or wget, sha256sum, and unzip or python3.
set -euo pipefail

DIR="${1:-data}"
DATASETS="${DATASETS:-sst snli glove}"
KEEP_ARCHIVES="${KEEP_ARCHIVES:-0}"

SST_URL="https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
SNLI_URL="https://nlp.stanford.edu/projects/snli/snli_1.0.zip"
GLOVE_URL="https://nlp.stanford.edu/data/glove.840B.300d.zip"

# Expected sha256 checksums of the three zips. They are deliberately left empty here: fill them in from the
# official release (or from a copy you have verified yourself) to have every download checked; an empty value
# skips the check with a warning. (torchtext lists the md5 981c3df556bbaea3f17f752456d0088c for snli_1.0.zip,
# which can be checked by hand with md5sum.)
SST_SHA256="${SST_SHA256:-}"
SNLI_SHA256="${SNLI_SHA256:-}"
GLOVE_SHA256="${GLOVE_SHA256:-}"

ARCHIVES="$DIR/archives"

log() { printf '[download_text_data] %s\n' "$*"; }

fetch() {  # fetch URL DEST: download to DEST (via a .part file) unless DEST exists
    local url="$1" dest="$2"
    if [[ -s "$dest" ]]; then
        log "already downloaded: $dest"
        return
    fi
    log "downloading $url -> $dest"
    mkdir -p "$(dirname "$dest")"
    if command -v curl >/dev/null 2>&1; then
        curl -fL --retry 3 --continue-at - -o "$dest.part" "$url"
    elif command -v wget >/dev/null 2>&1; then
        wget -c -O "$dest.part" "$url"
    else
        log "error: neither curl nor wget is installed" >&2
        exit 1
    fi
    mv "$dest.part" "$dest"
}

verify() {  # verify FILE EXPECTED_SHA256 NAME
    local file="$1" expected="$2" name="$3" actual
    if [[ -z "$expected" ]]; then
        log "warning: ${name}_SHA256 is not set; $file is not checked"
        return
    fi
    log "checking sha256 of $file"
    actual="$(sha256sum "$file" | cut -d' ' -f1)"
    if [[ "$actual" != "$expected" ]]; then
        log "error: sha256 mismatch for $file: expected $expected, got $actual" >&2
        exit 1
    fi
    log "sha256 ok: $actual"
}

extract() {  # extract ZIP DEST MEMBER...: unpack the named members into DEST, without their folders
    local zip="$1" dest="$2"
    shift 2
    mkdir -p "$dest"
    log "unpacking $* from $zip into $dest"
    if command -v unzip >/dev/null 2>&1; then
        unzip -o -j "$zip" "$@" -d "$dest"
    else
        python3 - "$zip" "$dest" "$@" <<'PY'
import shutil
import sys
import zipfile
from pathlib import Path

archive, dest, members = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
with zipfile.ZipFile(archive) as z:
    for member in members:
        with z.open(member) as src, open(dest / Path(member).name, "wb") as out:
            shutil.copyfileobj(src, out)
PY
    fi
}

finish() {  # finish ZIP: delete the archive unless KEEP_ARCHIVES=1
    if [[ "$KEEP_ARCHIVES" != "1" ]]; then
        log "removing $1"
        rm -f "$1"
    fi
}

all_exist() {
    local f
    for f in "$@"; do
        [[ -s "$f" ]] || return 1
    done
}

get_sst() {
    local out="$DIR/sst" zip="$ARCHIVES/trainDevTestTrees_PTB.zip"
    if all_exist "$out/train.txt" "$out/dev.txt" "$out/test.txt"; then
        log "SST already in $out"
        return
    fi
    fetch "$SST_URL" "$zip"
    verify "$zip" "$SST_SHA256" SST
    extract "$zip" "$out" trees/train.txt trees/dev.txt trees/test.txt
    finish "$zip"
    log "SST ready in $out (expect 8544 / 1101 / 2210 lines; 6920 / 872 / 1821 for the binary task)"
}

get_snli() {
    local out="$DIR/snli" zip="$ARCHIVES/snli_1.0.zip"
    if all_exist "$out/snli_1.0_train.jsonl" "$out/snli_1.0_dev.jsonl" "$out/snli_1.0_test.jsonl"; then
        log "SNLI already in $out"
        return
    fi
    fetch "$SNLI_URL" "$zip"
    verify "$zip" "$SNLI_SHA256" SNLI
    extract "$zip" "$out" snli_1.0/snli_1.0_train.jsonl snli_1.0/snli_1.0_dev.jsonl snli_1.0/snli_1.0_test.jsonl
    finish "$zip"
    log "SNLI ready in $out (550,152 / 10,000 / 10,000 lines before dropping gold label '-')"
}

get_glove() {
    local out="$DIR/glove" zip="$ARCHIVES/glove.840B.300d.zip"
    if all_exist "$out/glove.840B.300d.txt"; then
        log "GloVe 840B already in $out"
        return
    fi
    fetch "$GLOVE_URL" "$zip"
    verify "$zip" "$GLOVE_SHA256" GLOVE
    extract "$zip" "$out" glove.840B.300d.txt
    finish "$zip"
    log "GloVe ready: $out/glove.840B.300d.txt"
}

log "target folder: $DIR; datasets: $DATASETS"
mkdir -p "$DIR"
for name in $DATASETS; do
    case "$name" in
        sst) get_sst ;;
        snli) get_snli ;;
        glove) get_glove ;;
        *)
            log "error: unknown dataset '$name' (choose from: sst snli glove)" >&2
            exit 1
            ;;
    esac
done
rmdir "$ARCHIVES" 2>/dev/null || true
log "done"
