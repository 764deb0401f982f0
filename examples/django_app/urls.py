"""The Django example's one route."""

from django.urls import path

from examples.django_app.shop.views import place_order

urlpatterns = [path("orders", place_order)]
