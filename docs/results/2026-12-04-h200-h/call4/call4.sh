#!/usr/bin/env bash
# Call 4 (session 38): Nsight Compute on olmoe (the shape furthest under issue 18's lines: its forward
# 17% over torch's two GEMMs alone, f+b 57% of the peak in call 3): the timed forward, the backward's
# forward and the backward (bench/h200_session.sh profile; ncu.log).
#   MOK_COMMIT=<hash> bash docs/results/2026-12-04-h200-h/call4/call4.sh
set -uo pipefail
MOK_PROFILE_SHAPE=olmoe bash bench/h200_session.sh profile
