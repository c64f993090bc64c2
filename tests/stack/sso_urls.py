"""The site's routes plus the SSO callback, for tests that run without SSO configured at start
(stack.urls adds /oidc/ only when OIDC_RP_CLIENT_ID is set in the environment)."""

from __future__ import annotations

from django.urls import path
from mozilla_django_oidc.views import OIDCAuthenticationRequestView, OIDCLogoutView

from registry.auth.sso import SwitchyardOIDCCallbackView
from stack.urls import urlpatterns as site_urlpatterns

urlpatterns = [
    path("oidc/callback/", SwitchyardOIDCCallbackView.as_view(), name="oidc_authentication_callback"),
    path("oidc/authenticate/", OIDCAuthenticationRequestView.as_view(), name="oidc_authentication_init"),
    path("oidc/logout/", OIDCLogoutView.as_view(), name="oidc_logout"),
    *site_urlpatterns,
]
