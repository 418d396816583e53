"""The export stage: the trained model as verified GGUF files and an Ollama Modelfile (see ``stage``)."""
