"""The HTTP API every node serves: one app, the dialects it speaks (chat completions, Messages, Responses, Ollama),
the cluster's and the catalog's endpoints. It talks to the master only through MasterClient (exo.master.client)."""
