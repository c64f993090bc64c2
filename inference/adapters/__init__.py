"""Provider adapters behind one interface (inference.adapters.base.Adapter)."""
