"""Published or user measurements in, predicted-vs-measured errors out (``kvsim validate``)."""
