"""The wire types of every dialect the API speaks: OpenAI Chat Completions (openai_chat), Anthropic Messages
(anthropic_*), OpenAI Responses (openai_responses*) and Ollama (ollama)."""
