#!/bin/sh
# ir_alone.sh IR_ALONE FILE PASS OUT: IR_ALONE (tests/ir_alone.c) reads FILE, dumped after PASS, verifies it
# and prints it; the text must be FILE's but its comments and flags line (the options, which the IR
# layer alone does not parse).
set -e
mkdir -p "$(dirname "$4")"
"$1" "$2" "$3" > "$4"
grep -v '^#' "$2" | grep -v '^flags:' > "$4.want"
grep -v '^flags:' "$4" | diff "$4.want" -
echo "ir_alone: $2 read, verified after $3 and printed back unchanged"
