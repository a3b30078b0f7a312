"""One router per extra wire protocol (Messages API, Responses API), registered by `exo.api.app`."""
