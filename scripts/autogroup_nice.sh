#!/bin/bash
# On a shared machine during a benchmark: nice 19 only works within a session's scheduler autogroup, so this
# gives every nice-19 process's autogroup nice 19 too (run as root, in the background; stop it after).
while true; do
  for p in $(ps -eo pid=,ni= | awk '$2==19{print $1}'); do
    g=/proc/$p/autogroup
    [ -w $g ] && grep -q 'nice 0' $g 2>/dev/null && echo 19 > $g 2>/dev/null
  done
  sleep 5
done
