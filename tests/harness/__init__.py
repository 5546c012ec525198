"""The shared test harness: build the C parts once, give each test a fresh simulated
GPU, run workloads on it and read simgpu's own accounting. Later parts (tgsd, a private
dockerd) extend this package rather than writing their own."""
