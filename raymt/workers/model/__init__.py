"""The network: Marian / M2M100 transformer math with shape comments (``model``), its KV cache (``cache``), the decode step's small operators (``step_ops``), the output layer as the search sees it (``output_head``), packed float32 linears (``packed_linear``), teacher-forced batches (``batch``) and every CUDA-only call (``graphs``).

Imports torch and ``raymt.workers.config`` only: never the search, the decoder, ray, fsspec or pyarrow."""
