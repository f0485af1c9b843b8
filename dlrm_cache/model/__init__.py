"""The models: DLRM (:mod:`.dlrm`) and DCN-v2 (:mod:`.dcn`) over an embedding backend that never
says where its rows live.

May import `config/` and `embedding/` only.
"""
