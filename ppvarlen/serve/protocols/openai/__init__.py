"""The OpenAI embeddings API."""
