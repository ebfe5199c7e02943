"""HTTP: the requests a process serves, the CUDA work each caused, and what it cost.

    abi          the mirror of bpf/http.h: the HTTP capture's records
    probes       the syscall probes' maps and ring (HttpProbes); conns: connections held before
    parser       probe records → HTTP/1.1 requests and responses
    attribution  which request each CUDA call was made for (numpy)
    requesttrack the capture loop's side: records → requests → attributed cost
    routes       trace's per-route table; otlp: each request as an OTLP span
"""
