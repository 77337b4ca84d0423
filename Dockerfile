# kjit in a container: the CUDA 13 toolkit image, kjit's Debian/Ubuntu packages, the build, the CPU
# test suite, an install into /usr/local, and `kjit doctor` as the default command. The steps are
# the README's (scripts/setup.sh, cmake, ctest), so CI's run of the README commands exercises them.
#
#   docker build -t kjit .
#   docker run --rm --gpus all kjit                  # doctor: driver, GPU, NVRTC, a test launch
#   docker run --rm --gpus all kjit kjit-tune --model llama-3.1-8b
#
# --gpus needs the NVIDIA Container Toolkit on the host. Without it (or without --gpus) the
# container sees no /dev/nvidia* and no libcuda.so.1, and doctor says so: "[FAIL] driver: no CUDA
# driver: libcuda.so.1 could not be loaded ... run it with the NVIDIA Container Toolkit (docker run
# --gpus all ...)"; compiling for an explicit --arch still works there.
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

WORKDIR /opt/kjit
COPY . .
RUN bash scripts/setup.sh \
 && cmake -S . -B build && cmake --build build -j"$(nproc)" \
 && ctest --test-dir build --output-on-failure -j"$(nproc)" \
 && cmake --install build --prefix /usr/local
CMD ["kjit", "doctor"]
