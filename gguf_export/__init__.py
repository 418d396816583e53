"""Standalone converter from a merged Hugging Face checkpoint to GGUF (on the
``gguf`` library), and its verifier in llama.cpp. Built in its own issue; the
package exists so the runtime image and the layout are fixed from the start.
"""
