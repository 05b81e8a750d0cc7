#!/bin/sh
# A bench on a bare machine that has Python 3.12 and torch but no network and no redis (a lent GPU machine):
#   sh bench/carry.sh prepare     here, with the network: cp312 wheels of what such an image lacks into .whl/,
#                                 and this machine's redis-server and redis-cli with their libraries into .carry/
#   . bench/carry.sh install      there, before the bench (sourced: it exports PYTHONPATH, PATH, LD_LIBRARY_PATH)
# Both folders are ignored by git; name them in the run's carry list. The versions are those `make setup` installed
# on 2026-11-27 (bench/results/bubbles.md's live runs used them).
WHEELS="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 redis==8.1.0
PuLP==3.3.2 highspy==1.16.0 hjson==3.1.0 typer==0.29.2 click==8.5.1 rich==15.0.0 shellingham==1.5.4
annotated-doc==0.0.7 typing_extensions==4.16.0 pandas==3.1.1 fsspec==2026.9.0 PyYAML==6.0.4 hiredis==3.5.0"
case "$1" in
prepare)
    mkdir -p .whl .carry/bin .carry/lib
    for wheel in $WHEELS; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$wheel" || exit 1
    done
    cp "$(command -v redis-server)" "$(command -v redis-cli)" .carry/bin/ || exit 1
    for lib in liblzf.so.1 libjemalloc.so.2 libatomic.so.1; do
        cp -L "/lib/x86_64-linux-gnu/$lib" .carry/lib/ || exit 1
    done
    du -sh .whl .carry
    ;;
install)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || return 1
    export PYTHONPATH="/tmp/site:$PWD" PATH="$PWD/.carry/bin:$PATH" LD_LIBRARY_PATH="$PWD/.carry/lib"
    export PYTHONUNBUFFERED=1
    redis-server --version || return 1
    ;;
*)
    echo "usage: sh bench/carry.sh prepare | . bench/carry.sh install" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
