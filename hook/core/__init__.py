"""The pure decision core: values parsed from bytes, rules, the plan, requests and decide. Imports
no source, adapter, route or tool."""
