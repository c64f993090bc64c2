"""The /api/ surface shared by every app: the registry's serializers and viewsets (viewsets) and
teams' endpoints (teams); bearer-token authentication, role permissions, bounded parsers and
pagination, known query parameters, checked serializer fields and the OpenAPI schema hooks."""
