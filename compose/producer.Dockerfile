# The gpuflight image: the node agent (`producer`) and the stream workers (`streams`) —
# Debian's bcc and our package (the BPF sources ship inside it as package data).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-bpfcc python3-venv python3-pip \
       gcc libc6-dev util-linux \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/gpuflight
COPY pyproject.toml README.md ./
COPY bpf ./bpf
COPY gpuflight ./gpuflight
COPY producer ./producer
COPY streams ./streams
# GPUFLIGHT_*_FILE variables (Docker secrets) become the variables gpuflight reads.
COPY compose/from-secrets /usr/local/bin/from-secrets
RUN python3 -m venv --system-site-packages /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir . \
    && rm -rf /opt/gpuflight
WORKDIR /
ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["/usr/local/bin/from-secrets", "gpuflight"]
